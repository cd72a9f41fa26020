"""The authorization table read from the config, and the role a client certificate names.
(Each role against every rpc over real mutual TLS: tests/integration/test_tls.py.)"""

import pytest

from apexrl import config as cfg
from apexrl.common import authz


def test_no_entries_give_each_role_what_its_own_code_calls():
    policy = authz.parse_policy([])
    assert policy["actor"] == {
        "apexrl.v1.Replay/Insert",
        "apexrl.v1.Replay/Info",
        "apexrl.v1.Learner/GetParameters",
    }
    assert "apexrl.v1.Replay/Checkpoint" in policy["learner"]
    assert "apexrl.v1.Replay/Insert" not in policy["learner"]
    assert policy["relay"] == {"apexrl.v1.Learner/GetParameters"}  # a parameter relay's pulls
    assert policy["admin"] == {"apexrl.v1.Learner/SetSetting"}  # a person: `apexrl set`
    assert set(policy) == {"actor", "learner", "relay", "evaluator", "admin"}
    assert set().union(*policy.values()) <= set(authz.METHODS)


def test_entries_replace_the_default_and_roles_left_out_may_call_nothing():
    policy = authz.parse_policy([{"role": "evaluator", "methods": ["apexrl.v1.Replay/Info"]}])
    assert policy == {"evaluator": frozenset({"apexrl.v1.Replay/Info"})}


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"role": "operator", "methods": []}], "unknown role 'operator'"),
        ([{"role": "actor", "methods": ["apexrl.v1.Replay/Drop"]}], "unknown method"),
        ([{"role": "actor", "methods": "apexrl.v1.Replay/Info"}], "must be a list"),
        ([{"role": "actor", "methods": [], "method": []}], "unknown key 'method'"),
        ([{"role": "actor", "methods": []}, {"role": "actor", "methods": []}], "given twice"),
        (["actor"], "must be a table"),
    ],
)
def test_a_bad_table_is_refused_naming_the_entry(entries, message):
    with pytest.raises(ValueError, match=message):
        authz.parse_policy(entries)


def test_a_config_file_with_an_unknown_role_is_refused(tmp_path):
    path = tmp_path / "apexrl.toml"
    path.write_text('[[authorization]]\nrole = "root"\nmethods = ["apexrl.v1.Replay/Info"]\n')
    with pytest.raises(ValueError, match=r"\[\[authorization\]\]: entry 0: unknown role 'root'"):
        cfg.parse(cfg.ReplayConfig, ["--config", str(path)], "replay", "apexrl replay")
    # The actors have no such setting: the shared file does not concern them.
    cfg.parse(cfg.ActorConfig, ["--config", str(path)], "actor", "apexrl actor")


def context(uris=(), dns=()) -> dict[str, list[bytes]]:
    """gRPC's auth context of a mutual TLS peer with these SANs."""
    return {"peer_uri": [u.encode() for u in uris], "peer_dns": [d.encode() for d in dns]}


@pytest.mark.parametrize(
    ("uris", "dns", "role"),
    [
        (["spiffe://cluster.local/ns/apexrl/sa/learner"], [], "learner"),
        (["spiffe://example.org/evaluator/"], [], "evaluator"),
        ([], ["actor"], "actor"),
        ([], ["actor.apexrl.svc.cluster.local", "actor.apexrl"], "actor"),
        ([], ["replay", "*.replay.apexrl.svc"], "replay"),
    ],
)
def test_the_role_comes_from_a_spiffe_uri_or_a_dns_san(uris, dns, role):
    assert authz.caller_role(context(uris, dns)) == role


@pytest.mark.parametrize(
    ("uris", "dns", "problem"),
    [
        ([], [], "names no apexrl role"),
        (["https://example.org/actor"], ["mallory"], "names no apexrl role"),
        ([], ["actors.apexrl"], "names no apexrl role"),
        (["spiffe://td/ns/apexrl/sa/learner"], ["actor"], "names several roles"),
    ],
)
def test_a_certificate_without_one_recognised_role_is_refused(uris, dns, problem):
    with pytest.raises(authz.PermissionDenied, match=problem) as refused:
        authz.caller_role(context(uris, dns))
    assert refused.value.code.name == "PERMISSION_DENIED"
