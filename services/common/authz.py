"""Per-RPC authorization on the mutual TLS path: who the caller is, from its client
certificate, and which methods that role may call, from a table in the config.

A role is the name of an apexrl workload (its Kubernetes ServiceAccount). The client
certificate names it by a URI SAN in the SPIFFE shape, `spiffe://<trust domain>/ns/<ns>/sa/<role>`
(what a service mesh or cert-manager's csi-driver-spiffe issues; the last path segment is the
role), or by a DNS SAN whose first label is the role (`actor`, `actor.apexrl.svc`: what the
mtls overlay's certificates carry). A certificate that names no role, or names two, is
refused: guessing would hand out someone's rights.

Health and reflection are open to every caller the CA admitted: they change nothing and
carry nothing the .proto files do not.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import grpc
import prometheus_client

from apexrl.common.errors import RequestError
from apexrl.v1 import learner_pb2, replay_pb2

ROLES = ("replay", "learner", "relay", "actor", "evaluator", "admin")

OPEN_SERVICES = (
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
)


def _methods(file_descriptor, service: str) -> list[str]:
    described = file_descriptor.services_by_name[service]
    return [f"{described.full_name}/{m.name}" for m in described.methods]


METHODS = tuple(
    _methods(replay_pb2.DESCRIPTOR, "Replay") + _methods(learner_pb2.DESCRIPTOR, "Learner")
)

# Used when the config has no [[authorization]] entries: what each role's own code calls.
# Actors insert and pull parameters (Info: the sharded client reads each shard's table);
# the learner samples, writes priorities and asks for checkpoints; a parameter relay pulls
# parameters; the evaluator pulls parameters and reports evaluations. The replay calls nobody.
DEFAULT_POLICY: dict[str, tuple[str, ...]] = {
    "actor": (
        "apexrl.v1.Replay/Insert",
        "apexrl.v1.Replay/Info",
        "apexrl.v1.Learner/GetParameters",
    ),
    "learner": (
        "apexrl.v1.Replay/Sample",
        "apexrl.v1.Replay/SampleStream",
        "apexrl.v1.Replay/UpdatePriorities",
        "apexrl.v1.Replay/UpdatePrioritiesStream",
        "apexrl.v1.Replay/Info",
        "apexrl.v1.Replay/Checkpoint",
    ),
    "relay": ("apexrl.v1.Learner/GetParameters",),
    "evaluator": ("apexrl.v1.Learner/GetParameters", "apexrl.v1.Learner/ReportEvaluation"),
    # A person's certificate (`apexrl set`): settings of the running learner.
    "admin": ("apexrl.v1.Learner/SetSetting",),
}


class PermissionDenied(RequestError):
    code = grpc.StatusCode.PERMISSION_DENIED


def parse_policy(entries: list, where: str = "[[authorization]]") -> dict[str, frozenset[str]]:
    """Role -> the methods it may call, from the config's `[[authorization]]` entries
    (`role = "actor"`, `methods = ["apexrl.v1.Replay/Insert", ...]`); none: DEFAULT_POLICY.
    ValueError naming the entry and the key for an unknown role, key or method, or a role
    given twice. Roles left out may call nothing."""
    if not entries:
        return {role: frozenset(methods) for role, methods in DEFAULT_POLICY.items()}
    policy: dict[str, frozenset[str]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ValueError(f"{where}: entry {i} must be a table (role, methods), got {entry!r}")
        unknown = set(entry) - {"role", "methods"}
        if unknown:
            raise ValueError(f"{where}: entry {i} has unknown key {sorted(unknown)[0]!r}")
        role, methods = entry.get("role"), entry.get("methods")
        if role not in ROLES:
            raise ValueError(
                f"{where}: entry {i}: unknown role {role!r} (roles: {', '.join(ROLES)})"
            )
        if role in policy:
            raise ValueError(f"{where}: role {role!r} is given twice")
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            raise ValueError(f"{where}: role {role!r}: methods must be a list of method names")
        for method in methods:
            if method not in METHODS:
                raise ValueError(
                    f"{where}: role {role!r}: unknown method {method!r} (methods: "
                    f"{', '.join(METHODS)})"
                )
        policy[role] = frozenset(methods)
    return policy


def roles_named(uris: Iterable[str], dns_names: Iterable[str]) -> set[str]:
    """The roles a certificate's URI and DNS SANs name (see the module docstring)."""
    named = set()
    for uri in uris:
        if uri.startswith("spiffe://"):
            named.add(uri.rstrip("/").rpartition("/")[2])
    for name in dns_names:
        named.add(name.split(".", 1)[0])
    return named & set(ROLES)


def caller_role(auth_context: Mapping[str, Iterable[bytes]]) -> str:
    """The role of a mutual TLS caller, from gRPC's auth context; PermissionDenied if its
    certificate names none or several."""

    def values(key: str) -> list[str]:
        return [v.decode() for v in auth_context.get(key, [])]

    uris, dns_names = values("peer_uri"), values("peer_dns")
    roles = roles_named(uris, dns_names)
    if len(roles) == 1:
        return roles.pop()
    sans = ", ".join([*(f"URI:{u}" for u in uris), *(f"DNS:{d}" for d in dns_names)]) or "none"
    problem = "names no apexrl role" if not roles else f"names several roles {sorted(roles)}"
    raise PermissionDenied(
        "client certificate",
        f"{problem} (SANs: {sans}); a role is a URI SAN spiffe://<domain>/ns/<ns>/sa/<role> or"
        f" a DNS SAN <role>[.<namespace>...], one of {', '.join(ROLES)}",
    )


@dataclass
class Authorizer:
    """Refuses a call whose caller's role may not call its method, counting the refusal."""

    policy: Mapping[str, frozenset[str]]
    denied: prometheus_client.Counter

    @classmethod
    def from_config(
        cls, entries: list, registry: prometheus_client.CollectorRegistry
    ) -> "Authorizer":
        denied = prometheus_client.Counter(
            "apexrl_authz_denied",
            "RPCs refused PERMISSION_DENIED by role ('none': a certificate naming no role) and"
            " method.",
            ["role", "grpc_method"],
            registry=registry,
        )
        return cls(parse_policy(entries), denied)

    def check(self, context: grpc.aio.ServicerContext, method: str) -> None:
        """PermissionDenied naming the role and the method, unless the policy allows it."""
        if method.lstrip("/").partition("/")[0] in OPEN_SERVICES:
            return
        method = method.lstrip("/")
        try:
            role = caller_role(context.auth_context())
        except PermissionDenied:
            self.denied.labels("none", method).inc()
            raise
        if method not in self.policy.get(role, frozenset()):
            self.denied.labels(role, method).inc()
            allowed = ", ".join(sorted(self.policy.get(role, ()))) or "nothing"
            raise PermissionDenied(
                "caller", f"role {role!r} may not call {method} (it may call: {allowed})"
            )
