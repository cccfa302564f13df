"""A fieldsync site inside a PostgreSQL database (the consolidated).

The foundation of the PostgreSQL backend: URIs (:mod:`.uri`), connections
and their errors (:mod:`.connect`), the agent's lock (:mod:`.lock`), the
``fieldsync`` schema (:mod:`.schema`), the types table (:mod:`.typemap`),
capture triggers (:mod:`.capture`) and the log in commit order
(:mod:`.log`); and the site, :class:`.site.PostgresSite`, which implements
the site interface over them: the catalogue and bookkeeping
(:mod:`.identity`, :mod:`.catalogue`, :mod:`.subscriptions`,
:mod:`.remotes`, :mod:`.settings`), the log readers (:mod:`.reading`: the
rows agent.site.selection's readers are made from), extraction
(:mod:`.extract`) and apply (:mod:`.apply`, with the SQLite
consolidated's rules).  See docs/postgres.md.  psycopg is imported by the
modules that need it, not by ``agent.site``.
"""
