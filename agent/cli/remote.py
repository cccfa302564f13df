"""``agent remote``: the remote-user table's rows (SQL Remote's GRANT REMOTE)."""

from __future__ import annotations

from datetime import time
from pathlib import Path

import click
from click.core import ParameterSource
from rich.table import Table

from .. import crashpoints  # noqa: F401  (FIELDSYNC_CRASH arms a subscription change's point)
from ..errors import AgentError
from ._remote_values import public_key_line, refuse_own_inbox, split_subscription, subscription_value
from ._common import (ADDRESS, DATABASE, SHARED_INBOX_HELP, SITE_NAME, TRANSPORT, Duration, TimeOfDay,
                      TransportOption, check_stored_address, check_transport_settings, console, error_console,
                      format_seconds, key_fingerprint, open_site, require_remote, schedule_text,
                      shared_inbox_warnings, stored_options)

INBOX_HELP = ("The remote's own inbox where it differs from --address (email: its IMAP mailbox, "
              "imaps://north@host/INBOX); `agent extract` gives it to the remote.")
PEER_OPTION_HELP = ("A setting NAME=VALUE of the transport to this remote where it differs from the site's own, "
                    "stored with the site (never a password itself). Repeatable.")


@click.group()
def remote() -> None:
    """Add, change, subscribe, list and remove the site's remote users (its peers); acknowledge their apply errors.

    At the consolidated there is one remote user per field site; at a field
    site, one for its consolidated (extraction makes it).
    """


@remote.command("add")
@click.argument("database", type=DATABASE)
@click.argument("name", type=SITE_NAME, required=False, metavar="NAME")
@click.option("--address", type=ADDRESS, help="The remote's inbox on its transport (folder: a directory).")
@click.option("--transport", type=TRANSPORT, default="folder", show_default=True, help="The transport that reaches that inbox.")
@click.option("--public-key", "public_key", metavar="LINE", help="The remote's public key line (from `agent key`).")
@click.option("--public-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding the remote's public key line.")
@click.option("--subscribe", "subscriptions", multiple=True, metavar="PUB[=VALUE]",
              help="Subscribe to publication PUB (with the SUBSCRIBE BY value VALUE). Repeatable.")
@click.option("--send-every", type=Duration(whole_seconds=True), metavar="DURATION",
              help="SEND EVERY: send at this interval (90, 90s, 5m, 1h).")
@click.option("--send-at", type=TimeOfDay(), metavar="HH:MM", help="SEND AT: send once a day at this local time.")
@click.option("--from", "from_file", type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              metavar="FILE", help="Add every remote of FILE (CSV with a header, or JSON lines; - for stdin) "
                                   "in one transaction, instead of NAME and its options.")
@click.option("--inbox", type=ADDRESS, help=INBOX_HELP)
@click.option("--transport-option", "-O", "options", multiple=True, type=TransportOption(), help=PEER_OPTION_HELP)
@click.option("--shared-inbox", is_flag=True, help=SHARED_INBOX_HELP)
@click.option("--format", "file_format", type=click.Choice(["csv", "jsonl"]),
              help="The format of --from FILE (default: from its extension, .csv or .jsonl).")
def add(database: Path, name: str | None, address: str | None, transport: str, public_key: str | None,
        public_key_file: Path | None, subscriptions: tuple[str, ...], send_every: int | None,
        send_at: time | None, inbox: str | None, options: tuple, from_file: Path | None,
        shared_inbox: bool, file_format: str | None) -> None:
    """Add the remote user NAME to the site in DATABASE, or with --from
    FILE every remote of FILE at once (all or none).

    Its stream starts at the current end of the log: extract the remote
    (`agent extract`) to give it the rows it subscribes to.

    Example: agent remote add hq.db north --address /mnt/sync/north --subscribe territory=north

    Example: agent remote add hq.db --from remotes.csv
    """
    from transports.registry import check_transport_spec

    if from_file is not None:
        given = [option for option, value in (("NAME", name), ("--address", address), ("--public-key", public_key),
                                              ("--public-key-file", public_key_file),
                                              ("--subscribe", subscriptions), ("--send-every", send_every),
                                              ("--send-at", send_at), ("--inbox", inbox),
                                              ("-O", options)) if value]
        if click.get_current_context().get_parameter_source("transport") is not ParameterSource.DEFAULT:
            given.append("--transport")
        if given:
            raise click.UsageError(f"--from FILE takes every remote from the file; {given[0]} goes in the file's "
                                   "columns instead")
        from ._fleet import add_from_file

        return add_from_file(database, from_file, file_format, shared_inbox=shared_inbox)
    if file_format is not None:
        raise click.UsageError("--format is the format of --from FILE; give --from as well")
    if name is None:
        raise click.UsageError("missing argument 'NAME': give the remote's name, or --from FILE for many remotes")
    if address is None:
        raise click.UsageError("missing option '--address': give the remote's inbox (a folder such as "
                               "inbox/north, or sftp://user@host/path)")
    if send_every is not None and send_at is not None:
        raise click.UsageError("--send-every and --send-at exclude each other: a remote is sent to at an "
                               "interval or at a time of day")
    check_transport_spec(transport)
    check_stored_address(transport, address)
    settings = {key: value for key, value in stored_options(options).items() if value is not None}
    check_transport_settings(transport, settings, inbox=inbox, send=address, inbox_option="--inbox",
                             send_option="--address")
    line = public_key_line(name, public_key, public_key_file)
    wanted = [split_subscription(text) for text in subscriptions]
    with open_site(database) as site:
        # Check every subscription before adding, so a typo adds nothing.
        typed = [(publication, subscription_value(site, publication, value)) for publication, value in wanted]
        refuse_own_inbox(site, name, address, transport)
        shared = [] if shared_inbox else shared_inbox_warnings(site, [(name, address, transport)])
        added = site.add_remote(name, address=address, transport=transport, public_key=line,
                                send_every=send_every, send_at=send_at)
        if inbox is not None or settings:
            site.set_transport(peer=name, inbox=inbox, options=settings)
        changes = [site.subscribe(name, publication, value) for publication, value in typed]
    out = console()
    out.print(f"Added remote {added.name} at {address} ({transport}); sending {schedule_text(send_every, send_at)}.",
              soft_wrap=True)
    for line in shared:
        error_console().print(line, soft_wrap=True)
    for change in changes:
        out.print(f"Subscribed {name} to {change.publication}"
                  + ("" if change.value is None else f" with {change.value!r}"), soft_wrap=True)
        _warn_no_row(database, name, change)
    if line is None:
        out.print(f"No public key yet: `agent extract {database} {name} TARGET` makes the remote's keys, "
                  "or add them with --public-key.", soft_wrap=True)


@remote.command("set")
@click.argument("database", type=DATABASE)
@click.argument("name", type=SITE_NAME)
@click.option("--address", type=ADDRESS, help="The remote's new inbox address.")
@click.option("--transport", type=TRANSPORT, help="The transport that reaches it now.")
@click.option("--public-key", "public_key", metavar="LINE", help="The remote's new public key line.")
@click.option("--public-key-file", type=click.Path(dir_okay=False, path_type=Path),
              help="A file holding the remote's new public key line.")
@click.option("--send-every", type=Duration(whole_seconds=True), metavar="DURATION",
              help="SEND EVERY: send at this interval from now on.")
@click.option("--send-at", type=TimeOfDay(), metavar="HH:MM", help="SEND AT: send once a day at this local time.")
@click.option("--no-schedule", is_flag=True, help="No schedule: send whenever the agent runs.")
@click.option("--heartbeat", type=Duration(whole_seconds=True), metavar="DURATION",
              help="A control message to this remote at least this often (default: the run's --heartbeat).")
@click.option("--default-heartbeat", is_flag=True, help="Use the run's --heartbeat for this remote again.")
@click.option("--confirm-timeout", type=Duration(whole_seconds=True), metavar="DURATION",
              help="Probe this remote after this much silence while data sent to it is unconfirmed (default: the "
                   "run's --confirm-timeout; never above its heartbeat).")
@click.option("--default-confirm-timeout", is_flag=True, help="Use the run's --confirm-timeout for this remote again.")
@click.option("--inbox", type=ADDRESS, help=INBOX_HELP)
@click.option("--transport-option", "-O", "options", multiple=True, type=TransportOption(), help=PEER_OPTION_HELP)
@click.option("--unset", "unset", multiple=True, metavar="NAME", help="Forget a stored transport option. Repeatable.")
@click.option("--shared-inbox", is_flag=True, help=SHARED_INBOX_HELP)
def set_(database: Path, name: str, address: str | None, transport: str | None, public_key: str | None,
         public_key_file: Path | None, send_every: int | None, send_at: time | None, no_schedule: bool,
         heartbeat: int | None, default_heartbeat: bool, confirm_timeout: int | None,
         default_confirm_timeout: bool, inbox: str | None, options: tuple,
         unset: tuple[str, ...], shared_inbox: bool) -> None:
    """Change how the remote user NAME is reached: its address, transport,
    public key or send schedule.

    Its stream goes on where it is (unlike removing and adding it again,
    which starts a new one); files already handed to the old transport are
    not moved.

    Example: agent remote set hq.db north --transport sftp --address sftp://sync@hq.example.com/north
    """
    from transports.registry import check_transport_spec

    if sum((send_every is not None, send_at is not None, no_schedule)) > 1:
        raise click.UsageError("--send-every, --send-at and --no-schedule exclude each other")
    if heartbeat is not None and default_heartbeat:
        raise click.UsageError("--heartbeat and --default-heartbeat exclude each other")
    if confirm_timeout is not None and default_confirm_timeout:
        raise click.UsageError("--confirm-timeout and --default-confirm-timeout exclude each other")
    if transport is not None:
        check_transport_spec(transport)
    line = public_key_line(name, public_key, public_key_file)
    changes: dict[str, object] = {}
    if address is not None:
        changes["address"] = address
    if transport is not None:
        changes["transport"] = transport
    if line is not None:
        changes["public_key"] = line
    if send_every is not None or send_at is not None or no_schedule:
        changes["send_every"], changes["send_at"] = send_every, send_at
    if heartbeat is not None or default_heartbeat:
        changes["heartbeat"] = heartbeat
    if confirm_timeout is not None or default_confirm_timeout:
        changes["confirm_timeout"] = confirm_timeout
    settings = stored_options(options, unset)
    if not changes and not settings and inbox is None:
        raise click.UsageError("nothing to change: give --address, --transport, a public key, a schedule, "
                               "a heartbeat, a confirm timeout, --inbox or a transport option")
    with open_site(database) as site:
        require_remote(site, name)
        old = site.remote(name)
        if (address or transport) and (address or old.address):
            check_stored_address(transport or old.transport or "folder", address or old.address,
                                 hint="" if address else f"; give --address with the new transport {transport}")
        refuse_own_inbox(site, name, address or old.address, transport or old.transport)
        shared = [] if shared_inbox or not (address or transport) or not (address or old.address) else \
            shared_inbox_warnings(site, [(name, address or old.address, transport or old.transport)])
        merged = {key: value for key, value in {**site.transport_options(name), **settings}.items()
                  if value is not None}
        check_transport_settings(transport or old.transport or "folder", merged, inbox=inbox,
                                 send=address or old.address, inbox_option="--inbox", send_option="--address")
        new = site.update_remote(name, **changes) if changes else old
        if settings or inbox is not None:
            site.set_transport(peer=name, inbox=inbox, options=settings)
            new = site.remote(name)
    out = console()
    for label, before, after in (("address", old.address, new.address), ("transport", old.transport, new.transport),
                                 ("key", key_fingerprint(old.public_key), key_fingerprint(new.public_key)),
                                 ("schedule", schedule_text(old.send_every, old.send_at),
                                  schedule_text(new.send_every, new.send_at)),
                                 ("heartbeat", _heartbeat_text(old.heartbeat), _heartbeat_text(new.heartbeat)),
                                 ("confirm timeout", _confirm_timeout_text(old.confirm_timeout),
                                  _confirm_timeout_text(new.confirm_timeout)),
                                 ("inbox", old.inbox, new.inbox)):
        if before != after:
            out.print(f"{name}: {label} {before or 'none'} -> {after or 'none'}", soft_wrap=True)
    for key, value in settings.items():
        out.print(f"{name}: transport option {key} " + ("forgotten" if value is None else f"= {value}"),
                  soft_wrap=True, markup=False)
    if old == new and not settings:
        out.print(f"{name}: nothing changed", soft_wrap=True)
    for line in shared:
        error_console().print(line, soft_wrap=True)


def _heartbeat_text(seconds: int | None) -> str:
    return "the run's --heartbeat" if seconds is None else f"every {format_seconds(seconds)}"


def _confirm_timeout_text(seconds: int | None) -> str:
    return "the run's --confirm-timeout" if seconds is None else format_seconds(seconds)


@remote.command("subscribe")
@click.argument("database", type=DATABASE)
@click.argument("name", type=SITE_NAME)
@click.argument("subscriptions", nargs=-1, required=True, metavar="PUB[=VALUE]...")
def subscribe(database: Path, name: str, subscriptions: tuple[str, ...]) -> None:
    """Subscribe the remote NAME to publications.

    An extracted remote gets the rows that enter its subset as INSERTs with
    its next send, in log order: no new extraction. A value that matches no
    row now is taken, with a warning.
    """
    _change(database, name, subscriptions, subscribe=True)


@remote.command("unsubscribe")
@click.argument("database", type=DATABASE)
@click.argument("name", type=SITE_NAME)
@click.argument("subscriptions", nargs=-1, required=True, metavar="PUB[=VALUE]...")
def unsubscribe(database: Path, name: str, subscriptions: tuple[str, ...]) -> None:
    """End subscriptions of the remote NAME, one value each.

    An extracted remote gets DELETEs of the rows that leave its subset with
    its next send, in log order. A value it does not hold is refused.
    """
    _change(database, name, subscriptions, subscribe=False)


def _change(database: Path, name: str, subscriptions: tuple[str, ...], *, subscribe: bool) -> None:
    """Subscribe or unsubscribe, each subscription in its own transaction
    (every one is checked first, so a mistake changes nothing)."""
    wanted = [split_subscription(text) for text in subscriptions]
    from ..site.values import same_value

    with open_site(database) as site:
        require_remote(site, name)
        typed = [(publication, subscription_value(site, publication, value)) for publication, value in wanted]
        if not subscribe:
            held = [(item.publication, item.value) for item in site.subscriptions(name)]
            for publication, value in typed:
                if not any(pub == publication and same_value(old, value) for pub, old in held):
                    shown = ", ".join(pub if old is None else f"{pub}={old!r}" for pub, old in held) or "none"
                    raise AgentError(f"{name} does not subscribe to {publication}"
                                     + ("" if value is None else f" with {value!r}") + f" (its subscriptions: {shown})")
        changes = [(site.subscribe if subscribe else site.unsubscribe)(name, publication, value)
                   for publication, value in typed]
    out = console()
    for change in changes:
        what = change.publication + ("" if change.value is None else f" with {change.value!r}")
        if not change.changed:
            out.print(f"{name} subscribes to {what} already: nothing changed", soft_wrap=True)
            continue
        verb = f"Subscribed {name} to" if subscribe else f"Unsubscribed {name} from"
        if not change.streamed:
            follow = ": `agent extract` gives it its rows" if subscribe else ""
        else:
            rows = change.inserts if subscribe else change.deletes
            kind = "INSERTs" if subscribe else "DELETEs"
            count = "1 row goes" if rows == 1 else f"{rows} rows go"
            follow = (f": {count} to it as {kind} with its next send" if rows
                      else ": no row moves")
        out.print(f"{verb} {what}{follow}", soft_wrap=True)
        if subscribe:
            _warn_no_row(database, name, change)


def _warn_no_row(database: Path, name: str, change: "SubscriptionChange") -> None:  # noqa: F821
    """A value that matches no row now is taken (rows may come later), with one warning line: often a typo."""
    if change.matching == 0:
        error_console().print(
            f"warning: no row of publication {change.publication} holds {change.value!r} now; the subscription "
            f"is kept (rows may come later; `agent remote unsubscribe {database} {name} "
            f"{change.publication}={change.value}` undoes it)", soft_wrap=True, highlight=False)


@remote.command("list")
@click.argument("database", type=DATABASE)
def list_(database: Path) -> None:
    """List the remote users of DATABASE with their subscriptions."""
    with open_site(database) as site:
        remotes = site.remotes()
        subscriptions = site.subscriptions()
    out = console()
    if not remotes:
        out.print(f"{database} has no remote users; add one with `agent remote add`.", soft_wrap=True)
        return
    subscribed: dict[str, list[str]] = {}
    for item in subscriptions:
        subscribed.setdefault(item.remote, []).append(
            item.publication if item.value is None else f"{item.publication}={item.value}")
    table = Table(title=f"remote users of {database}")
    for column in ("remote", "transport", "address", "key", "schedule", "subscriptions"):
        table.add_column(column, overflow="fold")
    for row in remotes:
        table.add_row(row.name, row.transport or "-", row.address or "-", key_fingerprint(row.public_key) or "none",
                      schedule_text(row.send_every, row.send_at), ", ".join(subscribed.get(row.name, [])) or "-")
    out.print(table)


@remote.command("remove")
@click.argument("database", type=DATABASE)
@click.argument("name", type=SITE_NAME)
def remove(database: Path, name: str) -> None:
    """Remove the remote user NAME and its subscriptions.

    The log it held back may then be truncated; messages it sends later are
    quarantined.
    """
    with open_site(database) as site:
        require_remote(site, name)
        site.remove_remote(name)
    console().print(f"Removed remote {name} from {database}.", soft_wrap=True)


@remote.command("ack-errors")
@click.argument("database", type=DATABASE)
@click.argument("name", type=SITE_NAME)
@click.option("--through", type=click.IntRange(min=1), metavar="ID",
              help="Only the apply errors with an id up to ID (the ones you have read); later ones stay in force.")
def ack_errors(database: Path, name: str, through: int | None) -> None:
    """Acknowledge the apply errors of NAME's messages.

    They stay in the apply-error table as history, but no longer put NAME
    in error: unless a transport error or a stopped stream is in force,
    `agent status --errors` leaves it out and fieldsync_peer_in_error goes
    back to 0.
    """
    with open_site(database) as site:
        # A removed remote's apply errors can still be acknowledged.
        if name not in site.open_apply_errors():
            require_remote(site, name)
        count = site.acknowledge_apply_errors(name, through=through)
    noun = "apply error" if count == 1 else "apply errors"
    console().print(f"Acknowledged {count} {noun} of {name} in {database}." if count
                    else f"{name} has no apply errors to acknowledge in {database}.", soft_wrap=True)
