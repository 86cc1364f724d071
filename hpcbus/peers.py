"""`[delivery] peers`: the durables of another worker group reading the same subjects (a second InfluxDB
copy, docs/scaling.md "Two InfluxDBs"), created by whichever group binds first (`hpcbus.runner`)."""

from __future__ import annotations

import json
import logging

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig
from nats.js.errors import NotFoundError

from hpcbus.retry import describe

log = logging.getLogger("hpcbus.runner")

PEER_EXISTS = frozenset({10148, 10013, 10105})
"""JetStream's answers to a create-only consumer request when the consumer exists already (with another
config; as a name taken; bound and active): a peer its own workers made, left as they set it."""


async def create_peers(
    nc: NATS, js: JetStreamContext, stream: str, config: ConsumerConfig, peers: list[str], own: str
) -> None:
    """Create the durables of `[delivery] peers` that do not exist yet, with this worker's subjects: a
    stream with `interest` retention keeps a message only for the durables that exist when it is
    stored, so the group that starts later would otherwise never have what came before its first start.

    Create-only (the API's `action: create`): a peer that exists is left exactly as its own workers set
    it, even if it is being created by them at this moment (no create-or-update of ours lands second
    and overwrites their `ack_wait`). Best effort: any failure (no permission, no quorum, a timeout) is
    one WARNING, and this group still binds its own durable."""
    for peer in peers:
        if peer == own:
            continue
        try:
            await js.consumer_info(stream, peer)
            continue  # exists: its own workers set it
        except NotFoundError:
            pass
        except Exception as exc:  # no permission, no quorum, a timeout: try to create it all the same
            log.debug("peer durable %s on %s: %s", peer, stream, describe(exc))
        request = {
            "stream_name": stream,
            "config": config.evolve(durable_name=peer, name=peer).as_dict(),
            "action": "create",
        }
        try:
            msg = await nc.request(
                f"$JS.API.CONSUMER.CREATE.{stream}.{peer}", json.dumps(request).encode(), timeout=5
            )
            error = json.loads(msg.data).get("error")
        except Exception as exc:  # a timeout, no permission (the request goes unanswered), gone
            log.warning("peer durable %s on %s not created: %s", peer, stream, describe(exc))
            continue
        if error is None:
            log.info("created durable %s on %s for its own workers ([delivery] peers)", peer, stream)
        elif error.get("err_code") not in PEER_EXISTS:
            log.warning("peer durable %s on %s not created: %s", peer, stream, error.get("description"))
