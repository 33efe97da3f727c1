"""The Kubernetes manifests: valid against the Kubernetes schemas, one Deployment per role
with gRPC probes and resources, addresses that name real Services, and autoscaling on
metrics the service really exports. (No container engine or cluster runs here: the images
and a live apply are not tested.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from ragline.v1 import ragline_pb2, stages_pb2
from services.metrics import Metrics
from services.server import ROLE_SERVICES
from services.settings import Settings

pytestmark = pytest.mark.unit

K8S = Path(__file__).resolve().parents[2] / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33.0"
ROLES = ("gateway", *ROLE_SERVICES)


def _documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    docs = []
    for name in kustomization["resources"]:
        docs += [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]
    return docs


DOCS = _documents()


def _of(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in DOCS if d["kind"] == kind}


def test_every_file_is_listed_in_the_kustomization() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} == listed


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifest_is_valid_kubernetes(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("role", ROLES)
def test_each_role_is_a_deployment_with_grpc_probes_and_resources(role: str) -> None:
    deployment = _of("Deployment")[f"ragline-{role}"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["RAGLINE_SERVER_ROLE"] == role
    assert container["args"] == ["serve"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        if role == "gateway":  # a plaintext port: the gRPC health service itself
            assert container[probe]["grpc"]["port"] == ports["grpc"]
        else:  # a mutual-TLS port, which the kubelet cannot probe: the metrics port's probes
            check = container[probe]["httpGet"]
            assert check["port"] == "metrics" and "metrics" in ports
            assert check["path"] == ("/healthz" if probe == "livenessProbe" else "/readyz")
    assert container["resources"]["requests"]["cpu"] and container["resources"]["limits"]["memory"]
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]
    service = _of("Service")[f"ragline-{role}"]
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_the_shared_settings_are_real_settings_and_name_real_services() -> None:
    config = _of("ConfigMap")["ragline-config"]["data"]
    known = {
        f"{model.model_config['env_prefix']}{name}".upper()
        for model in (type(getattr(Settings(), section)) for section in Settings.model_fields)
        for name in model.model_fields
    }
    assert set(config) <= known, set(config) - known
    services = _of("Service")
    for key, value in config.items():
        if key.endswith("_ADDRESS"):
            host, port = value.split(":")
            ports = [p["port"] for p in services[host]["spec"]["ports"]]
            assert int(port) in ports, key
    assert config["RAGLINE_SERVER_PORT"] == "50051"
    redis = config["RAGLINE_CACHE_REDIS_URL"].split("//")[1].split(":")[0]
    assert redis in services


def test_autoscaling_is_on_latency_the_pods_really_export() -> None:
    adapter = yaml.safe_load(_of("ConfigMap")["ragline-prometheus-adapter"]["data"]["config.yaml"])
    exported = {m.name for m in Metrics().registry.collect()}
    rules = {}
    for rule in adapter["rules"]:
        series = rule["name"]["matches"].strip("^$")
        assert series.endswith("_bucket") and series.removesuffix("_bucket") in exported
        assert "histogram_quantile(0.95" in rule["metricsQuery"]
        rules[rule["name"]["as"]] = rule
    methods = {
        s.full_name: {m.name for m in s.methods}
        for s in (*ragline_pb2.DESCRIPTOR.services_by_name.values(),)
        + tuple(stages_pb2.DESCRIPTOR.services_by_name.values())
    }
    deployments = _of("Deployment")
    hpas = _of("HorizontalPodAutoscaler")
    assert hpas, "no autoscaling"
    for name, hpa in hpas.items():
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
        for metric in hpa["spec"]["metrics"]:
            assert metric["type"] == "Pods"  # latency per pod, not CPU
            rule = rules[metric["pods"]["metric"]["name"]]
            query = rule["seriesQuery"]
            if "grpc_method=" in query:  # the method must exist in the service it names
                service = query.split('grpc_service="')[1].split('"')[0]
                method = query.split('grpc_method="')[1].split('"')[0]
                assert method in methods[service], (name, service, method)


def _env(role: str) -> dict[str, str]:
    (container,) = _of("Deployment")[f"ragline-{role}"]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _mounted(role: str, path: str) -> str:
    """The secret mounted over ``path``'s folder in the role's pod."""
    spec = _of("Deployment")[f"ragline-{role}"]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    return str(volume["secret"]["secretName"])


@pytest.mark.parametrize("role", ROLES)
def test_the_services_speak_mutual_tls_to_each_other(role: str) -> None:
    """Every stage port asks its callers for a client certificate of the internal CA, and the
    roles that call stages (the gateway, the graph role) present one: the stage token never
    crosses the cluster network in clear text. The files come from one secret, made by
    deploy/k8s/internal-tls.sh (tested with real servers in tests/integration)."""
    env = _env(role)
    server = ("TLS_CERT_FILE", "TLS_KEY_FILE", "TLS_CLIENT_CA_FILE")
    client = ("TLS_CA_FILE", "TLS_CLIENT_CERT_FILE", "TLS_CLIENT_KEY_FILE")
    names = [
        *(server if role != "gateway" else ()),
        *(client if role in ("gateway", "graph") else ()),
    ]
    for name in names:
        assert _mounted(role, env[f"RAGLINE_SERVER_{name}"]) == "ragline-internal-tls", name
    if role == "gateway":  # its public port: plain gRPC behind the cluster's ingress
        assert "RAGLINE_SERVER_TLS_CERT_FILE" not in env
    if "RAGLINE_SERVER_TOKEN" in env:  # the stage token travels only over TLS
        assert "RAGLINE_SERVER_TLS_CA_FILE" in env


def test_only_the_pods_that_cache_may_reach_redis() -> None:
    """The cache is written by the retriever role alone: the policy lets its pods (every
    Deployment that serves the retriever role) and no other reach Redis's port."""
    (policy,) = _of("NetworkPolicy").values()
    redis = _of("Deployment")["ragline-redis"]["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= redis.items()
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    allowed = source["podSelector"]["matchLabels"]
    for name, deployment in _of("Deployment").items():
        template = deployment["spec"]["template"]
        (container, *_) = template["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        reaches = allowed.items() <= template["metadata"]["labels"].items()
        assert reaches == (env.get("RAGLINE_SERVER_ROLE") == "retriever"), name
    assert rule["ports"] == [{"protocol": "TCP", "port": 6379}]
