"""The site interface (agent/site/interface.py) and its backends: each
backend offers every member of :class:`Site` with the same signature, and
nothing the agent could reach besides (its constructors and the
connection for tests excepted).  A method added to one backend only, or a
parameter renamed in one, fails here."""

from __future__ import annotations

import inspect

import pytest

from agent.site.sqlite.database import SiteDatabase
from agent.site.interface import Site
from agent.site.locate import init_site, is_uri, open_site, site_home
from agent.site.errors import InvalidSetting

BACKEND_ONLY = {"init", "open", "connection"}  # made by locate.py; the connection is for tests and tools


def _members(cls: type) -> dict[str, object]:
    """The members ``cls`` and the bases it takes them from in this
    project define (a backend may keep a group of methods in a base class
    of its own)."""
    return {name: value for klass in reversed(cls.__mro__) if klass.__module__.startswith("agent.")
            for name, value in vars(klass).items() if not name.startswith("_") or name in ("__enter__", "__exit__")}


def _signature(member: object) -> inspect.Signature | str:
    if isinstance(member, property):
        return "property"
    signature = inspect.signature(member)  # type: ignore[arg-type]
    # Return annotations name the backend's own class (``-> SiteDatabase``) or Any; parameters must agree.
    return signature.replace(return_annotation=inspect.Signature.empty)


def _backends() -> list[type]:
    from agent.site.postgres.site import PostgresSite

    return [SiteDatabase, PostgresSite]


# What the PostgreSQL backend does not offer yet (issue 32 builds it step by
# step): this list only ever shrinks, and a method built while still listed
# fails the test, so the list stays exact.
NOT_YET = {
    "PostgresSite": set(),
}


@pytest.mark.parametrize("backend", _backends(), ids=lambda cls: cls.__name__)
def test_a_backend_offers_every_member_of_the_interface_with_its_signature(backend: type) -> None:
    expected = _members(Site)
    offered = _members(backend)
    missing = set(expected) - set(offered)
    assert missing == NOT_YET.get(backend.__name__, set()), f"{backend.__name__} lacks {sorted(missing)}"
    different = {name: (str(_signature(offered[name])), str(_signature(expected[name])))
                 for name in expected if name in offered
                 and str(_signature(offered[name])) != str(_signature(expected[name]))}
    assert not different, different


@pytest.mark.parametrize("backend", _backends(), ids=lambda cls: cls.__name__)
def test_a_backend_offers_nothing_the_interface_does_not_name(backend: type) -> None:
    extra = sorted(set(_members(backend)) - set(_members(Site)) - BACKEND_ONLY)
    assert not extra, f"{backend.__name__} offers {extra}: add them to agent/site/interface.py or make them private"


@pytest.mark.parametrize("location, uri", [
    ("postgresql://app@127.0.0.1:5432/sales", True),
    ("postgres:///sales?service=hq", True),
    ("hq.db", False),
    ("./postgresql:/hq.db", False),
    ("POSTGRESQL://app@host/sales", False),  # libpq's schemes are lower case
])
def test_a_uri_names_postgresql_and_anything_else_a_sqlite_file(location: str, uri: bool) -> None:
    assert is_uri(location) is uri


def test_a_sqlite_site_opened_by_location_is_the_sqlite_backend_with_its_folder_beside_it(tmp_path) -> None:
    path = tmp_path / "hq.db"
    with init_site(path, name="hq", role="consolidated") as made:
        assert isinstance(made, SiteDatabase)
    with open_site(path) as site:
        assert site.identity.name == "hq"
        assert site.home == tmp_path / "hq.db.agent" == site_home(path)


def test_home_is_refused_for_a_sqlite_file(tmp_path) -> None:
    with pytest.raises(InvalidSetting, match=r"--home is for a PostgreSQL site.*hq\.db\.agent"):
        init_site(tmp_path / "hq.db", name="hq", role="consolidated", home=tmp_path / "elsewhere")
    assert not (tmp_path / "hq.db").exists()


def test_a_postgresql_site_needs_a_home() -> None:
    with pytest.raises(InvalidSetting, match="--home DIR"):
        init_site("postgresql://app@127.0.0.1:1/sales", name="hq", role="consolidated")


def test_nothing_outside_the_site_package_names_a_backend() -> None:
    """The agent, the CLI, the chaos suite and the Spark path hold a Site:
    they import neither backend's class (agent/site/interface.py)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for folder in ("agent", "contrib", "transports", "codec"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.is_relative_to(root / "agent" / "site"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("site.postgres.site"):
                    found.append(f"{path.relative_to(root)}: imports {node.module}")
                if isinstance(node, ast.ImportFrom):
                    found += [f"{path.relative_to(root)}: imports {alias.name}" for alias in node.names
                              if alias.name in ("SiteDatabase", "PostgresSite")]
    assert not found, found


def _site_imports() -> dict[str, set[str]]:
    """The modules of agent.site each module of agent/site imports (a
    relative import resolved; an imported name that is a module counts as
    that module)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    imports: dict[str, set[str]] = {}
    for path in sorted((root / "agent" / "site").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        package = parts[:-1] if parts[-1] != "__init__" else parts
        module = ".".join(package if parts[-1] == "__init__" else parts)
        found = imports.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module or ""
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return imports


def _of(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_shared_site_modules_import_no_backend() -> None:
    """agent/site holds the interface and the rules both backends keep; each
    backend is a package of its own that imports them, never the other way
    round (docs/site-database.md, "Code layout").  locate.py and the
    package's face alone choose and re-export the backends."""
    choosers = {"agent.site", "agent.site.locate"}
    backends = ("agent.site.sqlite", "agent.site.postgres")
    found = [f"{module} imports {imported}" for module, imported_all in _site_imports().items()
             if module not in choosers and not any(_of(module, backend) for backend in backends)
             for imported in sorted(imported_all) if any(_of(imported, backend) for backend in backends)]
    assert not found, found


def test_the_backends_import_each_other_only_to_make_a_remotes_file() -> None:
    """The SQLite backend never imports the PostgreSQL one; the PostgreSQL
    one imports the SQLite one only to extract a remote, whose copy is a
    SQLite file, to write the SQLite statements of the indexes it gets
    (docs/postgres.md, "Extraction"), and to check the SQLite statements
    passthrough sends it (passthrough.py)."""
    extraction = {"agent.site.postgres.extract", "agent.site.postgres.extract_many", "agent.site.postgres.indexes",
                  "agent.site.postgres.passthrough", "agent.site.postgres.site"}
    found = []
    for module, imported_all in _site_imports().items():
        for imported in sorted(imported_all):
            if _of(module, "agent.site.sqlite") and _of(imported, "agent.site.postgres"):
                found.append(f"{module} imports {imported}")
            if _of(module, "agent.site.postgres") and _of(imported, "agent.site.sqlite") and (
                    module not in extraction or not imported.startswith(
                        ("agent.site.sqlite.extract", "agent.site.sqlite._db", "agent.site.sqlite.capture",
                         "agent.site.sqlite.changes"))):
                found.append(f"{module} imports {imported}")
    assert not found, found
