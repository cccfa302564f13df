"""A fieldsync site inside a SQLite file: a consolidated or a remote.

The SQLite backend: its plumbing (:mod:`._db`: connections, transactions,
errors), fieldsync's own tables and the site identity (:mod:`.schema`),
capture triggers (:mod:`.capture`, :mod:`.route` for rows that follow
their parent) and the log (:mod:`.log`); the catalogue and bookkeeping
(:mod:`.publications`, :mod:`.resubscribe`, :mod:`.remotes`,
:mod:`.settings`, :mod:`.agent_runs`), schema changes (:mod:`.ddl`,
:mod:`.changes`), the rows the shared readers are made from
(:mod:`.selection`), extraction of a remote's file (:mod:`.extract`,
:mod:`.extract_many`, :mod:`.foreign_keys`), apply (:mod:`.apply`); and
the site, :class:`.database.SiteDatabase`, which implements the site
interface over them.  The rules and values shared with the PostgreSQL
backend are agent/site's.  See docs/site-database.md.
"""
