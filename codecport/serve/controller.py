"""What `codec-serve --engine ray` asks of Ray Serve's controller that Serve's public API does not
give: which replicas of the deployment Serve is stopping (`serve.status()` counts them by state,
but does not name them), and where Serve's proxies listen. The one place that reaches into
Serve's private API (its controller's name, namespace and `get_serve_instance_details`); the
answer is read through Serve's public schema (`ray.serve.schema.ServeInstanceDetails`), so a Ray
whose answer changed shape fails here, saying so, rather than leaving replicas that are never
told to stop. codecport pins the Ray it was tested with ([ray] extra: 2.60).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..errors import CodecportError

log = logging.getLogger(__name__)


class ShapeError(CodecportError):
    """Serve's controller answered in a shape this codecport does not know."""


def handle():
    """Serve's controller actor (a blocking call to Ray's GCS: off an event loop)."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    return ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)


def ask(actor=None):
    """The controller's instance details, asked (an ObjectRef: `ray.get` it, or await it); `actor`,
    the controller's handle where the caller keeps one (`handle()` is a blocking call)."""
    return (actor or handle()).get_serve_instance_details.remote()


def parse(raw) -> object:
    """`ServeInstanceDetails` of the controller's answer; ShapeError if the schema does not hold."""
    import ray
    from ray.serve.schema import ServeInstanceDetails

    try:
        return ServeInstanceDetails(**raw)
    except Exception as e:  # noqa: BLE001 (pydantic's, or a TypeError of a changed answer)
        raise ShapeError(f"Ray Serve {ray.__version__}'s controller answered in a shape codecport does not "
                         f"know ({str(e).splitlines()[0]}); use the Ray codecport was tested with "
                         "(pip install 'codecport[ray]')") from None


@dataclass(frozen=True)
class Stops:
    """What Serve is stopping of a deployment: the whole application (`deleting`), or replicas."""

    deleting: bool
    replicas: frozenset[str]
    present: bool  # the application exists
    running: frozenset[str] = frozenset()  # the replicas Serve routes to


def _get(thing, key: str, default=None):
    """A field of a parsed answer (a schema's attribute) or of a raw one (a dict's key)."""
    return thing.get(key, default) if isinstance(thing, dict) else getattr(thing, key, default)


def _value(state) -> str:
    return str(getattr(state, "value", state))


def stops(details, app: str, deployment: str) -> Stops:
    """`Stops` of `deployment` of `app` in `details`, parsed, or the raw answer once one was (a
    process keeps its Ray: the board checks its first answer's shape only, and reads the rest as
    they come, at a fraction of the schema's cost)."""
    application = (_get(details, "applications") or {}).get(app)
    if application is None:
        return Stops(False, frozenset(), False)
    found = (_get(application, "deployments") or {}).get(deployment)
    replicas = [] if found is None else _get(found, "replicas") or []
    # An application being deleted lists no deployments any more (`serve delete` from a shell).
    state = {_get(r, "replica_id"): _value(_get(r, "state")) for r in replicas}
    status = _value(_get(application, "status"))
    return Stops(status == "DELETING", frozenset(k for k, v in state.items() if v == "STOPPING"), True,
                 frozenset(k for k, v in state.items() if v == "RUNNING"))


def listening(details) -> tuple[str, int]:
    """(host, port) of Serve's proxies in parsed `details`."""
    return details.http_options.host, details.http_options.port
