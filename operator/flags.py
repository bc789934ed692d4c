"""`pagoda operator`'s flags and the `OperatorConfig` they make (`config_from_args`), argparse
only: the CLI (pagoda.runtime.cli) adds them through `main.add_arguments`; `main.run` reads them.
Each flag's default is its `OperatorConfig` field's; the environment fills what a flag leaves
out (`OperatorConfig.from_env`).
"""

from __future__ import annotations

import argparse

from pagoda.operator.kube.names import RUN_AS_ID, PodIds
from pagoda.operator.spec.config import LOG_FORMATS, OperatorConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`pagoda operator`'s flags (the CLI in pagoda.runtime.cli calls this)."""
    _scope_and_api_arguments(parser)
    _autoscaling_arguments(parser.add_argument_group("autoscaling"))
    _autotune_arguments(parser.add_argument_group("autotuning"))
    _model_arguments(parser.add_argument_group("models"))
    _monitoring_arguments(parser.add_argument_group("monitoring"))
    _pod_arguments(parser.add_argument_group("pods"))


def _scope_and_api_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        help="serve only this namespace (repeatable)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="serve all namespaces (the default)"
    )
    parser.add_argument(
        "--default-image",
        default=None,
        help="runtime image when spec.image is empty (env PAGODA_DEFAULT_IMAGE)",
    )
    parser.add_argument(
        "--http-host", default="0.0.0.0", help="liveness/readiness bind address (default 0.0.0.0)"
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=8080,
        help="liveness/readiness port; 0 picks a free one (default 8080)",
    )
    parser.add_argument("--no-http", action="store_true", help="do not serve /healthz and /readyz")
    parser.add_argument(
        "--watch-timeout",
        type=float,
        default=300.0,
        help="server-side timeout of a watch request, s",
    )
    parser.add_argument(
        "--request-timeout", type=float, default=30.0, help="timeout of one API request, s"
    )
    parser.add_argument(
        "--connect-timeout", type=float, default=10.0, help="TCP/TLS connect timeout, s"
    )
    parser.add_argument(
        "--resync-interval", type=float, default=300.0, help="re-reconcile everything this often, s"
    )
    parser.add_argument(
        "--cluster-domain", default=None, help="for status.url (default cluster.local)"
    )
    parser.add_argument(
        "--log-format", choices=LOG_FORMATS, default="plain", help="plain, full or json logs"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="more logs")
    parser.add_argument("--debug", action="store_true", help="even more logs")
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering name (for several replicas: one is active, the others stand by; "
        "needs kopf's peering CRD and that object); default: standalone",
    )
    parser.add_argument(
        "--peering-priority",
        type=int,
        default=None,
        help="this replica's peering priority (unique per replica; the highest live one is "
        "active); default: an earlier start is a higher priority",
    )
    parser.add_argument(
        "--peering-lifetime",
        type=int,
        default=15,
        help="a replica that stopped without a goodbye counts as gone after this long, s",
    )


def _pod_id(value: str) -> int | None:
    """An id, or `none` (left out of the pods, for the platform to assign)."""
    if value.strip().lower() in ("none", "null", ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an id or 'none', got {value!r}") from None


def _pod_arguments(parser: argparse._ArgumentGroup) -> None:
    for flag, what in (
        ("--pod-run-as-user", "runAsUser"),
        ("--pod-run-as-group", "runAsGroup"),
        ("--pod-fs-group", "fsGroup"),
    ):
        parser.add_argument(
            flag,
            type=_pod_id,
            default=RUN_AS_ID,
            metavar="ID|none",
            help=f"the {what} of the model-server and tuning pods (default {RUN_AS_ID}, the "
            "image's user); none leaves it to the platform (OpenShift's restricted SCC)",
        )


def _autoscaling_arguments(auto: argparse._ArgumentGroup) -> None:
    auto.add_argument(
        "--prometheus-url",
        default=None,
        help="Prometheus base URL for TTFT/queue queries (env PAGODA_PROMETHEUS_URL)",
    )
    auto.add_argument(
        "--allowed-prometheus-url",
        action="append",
        default=[],
        metavar="PREFIX",
        help="a base URL that spec.autoscaling.prometheusURL may lie under (repeatable; env "
        "PAGODA_ALLOWED_PROMETHEUS_URLS, comma-separated); default: --prometheus-url only, "
        "any URL when that is not set either",
    )
    auto.add_argument(
        "--prometheus-timeout", type=float, default=5.0, help="timeout of one query, s"
    )
    auto.add_argument(
        "--autoscale-interval",
        type=float,
        default=5.0,
        help="evaluate every service this often, s (the pods are scraped every 5 s)",
    )
    auto.add_argument(
        "--ttft-window", default="1m", help="PromQL range of the p95 TTFT rate (default 1m)"
    )
    auto.add_argument(
        "--metrics-max-age",
        type=float,
        default=60.0,
        help="metrics older than this are stale: hold, s",
    )
    auto.add_argument(
        "--webhook-token-file",
        default=None,
        help="file with the bearer token POST /alerts requires (env PAGODA_WEBHOOK_TOKEN)",
    )
    auto.add_argument(
        "--webhook-tls-cert",
        default=None,
        help="PEM certificate (chain): serve the HTTP port (POST /alerts, /metrics, probes) "
        "over TLS; with --webhook-tls-key",
    )
    auto.add_argument("--webhook-tls-key", default=None, help="PEM private key of the cert")
    auto.add_argument(
        "--api-unready-after",
        type=float,
        default=60.0,
        help="/readyz answers 503 once every API call, or the status writes of some "
        "InferenceService, failed for this long, s",
    )
    auto.add_argument(
        "--alert-cooldown",
        type=float,
        default=30.0,
        help="ignore scale-up alerts this long after a scale up of the same service, s",
    )


def _autotune_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--no-autotune",
        action="store_true",
        help="never start tuning Jobs, even for services with spec.autotune.enabled",
    )
    group.add_argument(
        "--autotune-interval", type=float, default=15.0, help="look at tuning Jobs this often, s"
    )
    group.add_argument(
        "--autotune-retry-base",
        type=float,
        default=300.0,
        help="a failed tuning Job is retried after this × 2^(attempts-1), s (capped at 6 h)",
    )
    group.add_argument(
        "--autotune-product-grace",
        type=float,
        default=300.0,
        help="a node's GPU product label that disappears or appears counts after this long, s "
        "(a blink neither unmounts a profile nor starts a tuning Job)",
    )


def _monitoring_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--no-service-monitors",
        action="store_true",
        help="do not create a ServiceMonitor per InferenceService (and delete those made "
        "before): another one scrapes the pods, e.g. the chart's runtime ServiceMonitor",
    )
    group.add_argument(
        "--no-prometheus-rules",
        action="store_true",
        help="do not put Pagoda's alerts in the PrometheusRule of each autoscaled "
        "InferenceService: another rule carries them, e.g. the chart's PrometheusRule. The "
        "operator's keeps only the recording rule of the service's TTFT alert threshold "
        "(pagoda:ttft_alert_threshold_seconds, with targetTTFTSeconds; deleted without)",
    )
    group.add_argument(
        "--monitoring-label",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="add this label to every ServiceMonitor and PrometheusRule the operator makes "
        "(repeatable), e.g. release=kube-prometheus-stack so that Prometheus selects them",
    )


def _model_arguments(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--no-pin-models",
        action="store_true",
        help="do not resolve an hf:// branch or tag to a commit (each pod's download then asks "
        "the Hub itself, and replicas may serve different commits after a push)",
    )
    group.add_argument(
        "--hub-timeout",
        type=float,
        default=10.0,
        help="seconds one request to the Hugging Face Hub (HF_ENDPOINT) may take",
    )


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    overrides: dict[str, object] = {
        "http_host": args.http_host,
        "http_port": None if args.no_http else args.http_port,
        "watch_timeout_s": args.watch_timeout,
        "request_timeout_s": args.request_timeout,
        "connect_timeout_s": args.connect_timeout,
        "resync_interval_s": args.resync_interval,
        "log_format": args.log_format,
        "verbose": args.verbose,
        "debug": args.debug,
        "peering": args.peering,
        "peering_priority": args.peering_priority,
        "peering_lifetime_s": args.peering_lifetime,
        "http_tls_cert": args.webhook_tls_cert,
        "http_tls_key": args.webhook_tls_key,
        "prometheus_timeout_s": args.prometheus_timeout,
        "autoscale_interval_s": args.autoscale_interval,
        "ttft_window": args.ttft_window,
        "metrics_max_age_s": args.metrics_max_age,
        "alert_cooldown_s": args.alert_cooldown,
        "api_unready_after_s": args.api_unready_after,
        "autotune": not args.no_autotune,
        "autotune_interval_s": args.autotune_interval,
        "autotune_retry_base_s": args.autotune_retry_base,
        "autotune_product_grace_s": args.autotune_product_grace,
        "pin_models": not args.no_pin_models,
        "hub_timeout_s": args.hub_timeout,
        "service_monitors": not args.no_service_monitors,
        "prometheus_rules": not args.no_prometheus_rules,
        "monitoring_labels": tuple(_key_value(a) for a in args.monitoring_label),
        "pod_ids": PodIds(args.pod_run_as_user, args.pod_run_as_group, args.pod_fs_group),
    }
    if args.prometheus_url:
        overrides["prometheus_url"] = args.prometheus_url
    if args.allowed_prometheus_url:
        overrides["allowed_prometheus_urls"] = tuple(args.allowed_prometheus_url)
    if args.webhook_token_file:
        try:
            with open(args.webhook_token_file, encoding="utf-8") as f:
                overrides["webhook_token"] = f.read().strip()
        except OSError as e:
            raise ValueError(f"cannot read --webhook-token-file: {e}") from e
    if args.namespace:
        overrides["namespaces"] = tuple(args.namespace)
    elif args.all_namespaces:
        overrides["namespaces"] = ()
    if args.default_image:
        overrides["default_image"] = args.default_image
    if args.cluster_domain:
        overrides["cluster_domain"] = args.cluster_domain
    return OperatorConfig.from_env(**overrides)


def _key_value(arg: str) -> tuple[str, str]:
    key, sep, value = arg.partition("=")
    if not sep:
        raise ValueError(f"--monitoring-label {arg!r}: expected KEY=VALUE")
    return key, value
