"""A fieldsync site inside a PostgreSQL database (the consolidated).

The foundation of the PostgreSQL backend: URIs (:mod:`.uri`), connections
and their errors (:mod:`.connect`), the agent's lock (:mod:`.lock`), the
``fieldsync`` schema (:mod:`.schema`), the types table (:mod:`.typemap`),
capture triggers (:mod:`.capture`) and the log in commit order
(:mod:`.log`).  See docs/postgres.md.  psycopg is imported by the modules
that need it, not by ``agent.site``.
"""
