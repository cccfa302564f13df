"""A fieldsync site inside a PostgreSQL database (the consolidated).

The foundation of the PostgreSQL backend: URIs (:mod:`.uri`), connections
and their errors (:mod:`.connect`), the agent's lock (:mod:`.lock`), the
``fieldsync`` schema (:mod:`.schema`), the types table (:mod:`.typemap`),
capture triggers (:mod:`.capture`) and the log in commit order
(:mod:`.log`); and the catalogue, bookkeeping and log readers of a
site, :class:`.site.PostgresSite`, with SiteDatabase's methods for them
(:mod:`.identity`, :mod:`.catalogue`, :mod:`.subscriptions`,
:mod:`.remotes`, :mod:`.settings`, :mod:`.reading`: the rows
agent.site.selection's readers are made from).  See docs/postgres.md.
psycopg is imported by the modules that need it, not by ``agent.site``.
"""
