"""Official huaweicloudsdk* clients, made once per provider and called through retries.

``Clients(config, credentials)`` builds the ECS, VPC, EIP, NAT, IAM, IMS, KPS and OBS
clients for one region on first use.  With ``endpoint`` set (the emulator, or a private
deployment) every service is reached at that one address; otherwise the SDK's region
tables give the real endpoints.  ``for_region(other)`` gives the clients of another region
with the same credentials (a working node outside the workspace's region).

``call(service, method, request)`` is the only way the provider calls the cloud: it retries
throttling and server errors (see ``retry.py``), counts calls per action (for the
figures in the docs and for tests), and turns SDK failures into our errors.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from huaweicloudsdkcore.auth.credentials import BasicCredentials, GlobalCredentials
from huaweicloudsdkcore.exceptions import exceptions as sdk_exc
from huaweicloudsdkcore.http.http_config import HttpConfig

from ...core.errors import ConfigError
from .credentials import Credentials
from .retry import RetryPolicy, as_provider_error, call_with_retry

log = logging.getLogger("jupyter_cloudtik.huaweicloud")

SERVICES = ("ecs", "vpc", "eip", "eip3", "nat", "iam", "ims", "kps", "obs", "tms")
EMULATED_OBS_DOMAIN = "emulated.invalid"
REAL_OBS = "https://obs.{region}.myhuaweicloud.com"
# TMS (tags) is not a regional service: it has one endpoint per *site* (the Chinese site,
# the international site, the Europe site) and one per dedicated region, and an account
# exists on one site only.  The official SDK names them by one region each
# (huaweicloudsdktms/v1/region/tms_region.py: cn-north-4 -> tms.myhuaweicloud.com,
# ap-southeast-1 -> tms-intl.myhuaweicloud.com, eu-west-101 -> tms.eu-west-101.
# myhuaweicloud.eu, ru-moscow-1 and my-kualalumpur-1 their own); the Europe site's API
# reference says "The endpoint of TMS is tms.myhuaweicloud.eu"
# (https://support.huaweicloud.com/eu/api-tms/en-us_topic_0126416748.html), and a dedicated
# region's reference sends you to "Regions and Endpoints" or your administrator
# (https://support.huaweicloud.com/intl/en-us/tr-central-201-api-tms/en-us_topic_0126416748.html).
#: the SDK region whose TMS endpoint serves a workspace region, by site
TMS_SITE_OF = {"cn": "cn-north-4", "intl": "ap-southeast-1"}


def tms_endpoint(region: str, override: str | None = None) -> str:
    """The TMS endpoint that tags ``region``'s servers: ``override`` (``provider.
    tms_endpoint``) when given, the SDK's own entry when it names ``region`` (the Europe
    site's and the dedicated regions'), else the site's: the Chinese site's for ``cn-*``,
    the international site's for the rest.  An account of the other site (an international
    account in a ``cn-*`` region) or a dedicated region the SDK does not list sets
    ``tms_endpoint``: the site cannot be read from the region name."""
    if override:
        return override.rstrip("/")
    from huaweicloudsdktms.v1.region.tms_region import TmsRegion

    known = TmsRegion.static_fields
    entry = known.get(region) or known[TMS_SITE_OF["cn" if region.startswith("cn-")
                                                  else "intl"]]
    return entry.endpoints[0]


def emulated_host(real_endpoint: str) -> str:
    """The emulator's name for a real service address: ``https://tms-intl.myhuaweicloud.
    com`` -> ``http://tms-intl.emulated.invalid`` (reached through the emulator as the
    proxy, like OBS: the emulator tells the sites apart by the Host header)."""
    host = real_endpoint.split("://", 1)[-1].split("/", 1)[0]
    host = host.split(".myhuaweicloud.", 1)[0].removesuffix("." + EMULATED_OBS_DOMAIN)
    return f"http://{host}.{EMULATED_OBS_DOMAIN}"


class _HttpConfig(HttpConfig):
    """The SDK's config, plus an HTTP proxy for plain-http endpoints.

    The SDK only proxies https URLs; the emulator's OBS is plain http, reached through the
    emulator acting as the proxy (OBS addresses buckets by host name)."""

    def get_proxy(self):
        proxy = super().get_proxy()
        return {"http": proxy["https"], "https": proxy["https"]} if proxy else {}


def _silence(client: Any) -> Any:
    # SDK loggers do not propagate and have no handler: Python would print their errors
    # (which can include request URLs) to stderr.  Our own messages say what failed.
    logger = getattr(client, "_logger", None)
    if logger is not None and not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return client


class Clients:
    """The SDK clients of one account and region."""

    def __init__(self, provider_config: dict[str, Any], credentials: Credentials,
                 region: str | None = None, policy: RetryPolicy | None = None,
                 on_retry: Callable[[str, int, float, str], None] | None = None) -> None:
        self.config = provider_config
        self.credentials = credentials
        self.region = region or provider_config.get("region") or credentials.extra.get(
            "region")
        if not self.region:
            raise ConfigError("provider.region: missing; name the Huawei Cloud region, e.g. "
                              "cn-north-4", field="provider.region")
        self.endpoint = (provider_config.get("endpoint") or credentials.extra.get("endpoint")
                         or None)
        self.policy = policy or RetryPolicy()
        self.on_retry = on_retry
        self.checkpoint: Callable[[], None] | None = None
        self.counts: Counter[str] = Counter()
        self._clients: dict[str, Any] = {}
        self._lock = threading.RLock()  # building a client may look up the project
        self._project_id = provider_config.get("project_id") or credentials.project_id
        self._domain_id = credentials.domain_id

    def for_region(self, region: str) -> Clients:
        cfg = dict(self.config, region=region, project_id=None)
        return Clients(cfg, self.credentials, region, self.policy, self.on_retry)

    # identity -------------------------------------------------------------------------
    @property
    def domain_id(self) -> str:
        if self._domain_id is None:
            from huaweicloudsdkiam.v3 import KeystoneListAuthDomainsRequest

            resp = self.call("iam", "keystone_list_auth_domains",
                             KeystoneListAuthDomainsRequest())
            if not resp.domains:
                raise ConfigError("the credentials belong to no account (IAM lists no domain)",
                                  field="provider")
            self._domain_id = resp.domains[0].id
        return self._domain_id

    @property
    def project_id(self) -> str:
        if self._project_id is None:
            from huaweicloudsdkiam.v3 import KeystoneListProjectsRequest

            resp = self.call("iam", "keystone_list_projects",
                             KeystoneListProjectsRequest(name=self.region))
            if not resp.projects:
                raise ConfigError(
                    f"provider.region: the account has no project for region "
                    f"'{self.region}'", field="provider.region")
            self._project_id = resp.projects[0].id
        return self._project_id

    # clients --------------------------------------------------------------------------
    def _http_config(self, proxy: str | None = None) -> HttpConfig:
        cfg = _HttpConfig.get_default_config() if proxy is None else _HttpConfig()
        cfg.timeout = (10, 60)
        if proxy:
            scheme, rest = proxy.split("://", 1)
            host, _, port = rest.rstrip("/").partition(":")
            cfg.proxy_protocol, cfg.proxy_host = scheme, host
            cfg.proxy_port = int(port) if port else None
        return cfg

    def _build(self, service: str) -> Any:
        ak, sk = self.credentials.access_key, self.credentials.secret_key
        iam_endpoint = self.endpoint
        if service == "obs":
            from huaweicloudsdkobs.v1 import ObsClient
            from huaweicloudsdkobs.v1.obs_credentials import ObsCredentials

            endpoint = self.config.get("obs_endpoint")
            proxy = self.config.get("obs_proxy")
            if endpoint is None:
                if self.endpoint:  # the emulator: buckets by host name, through its proxy
                    endpoint = f"http://obs.{self.region}.{EMULATED_OBS_DOMAIN}"
                    proxy = proxy or self.endpoint
                else:
                    endpoint = REAL_OBS.format(region=self.region)
            return ObsClient.new_builder().with_credentials(ObsCredentials(ak, sk)) \
                .with_endpoints([endpoint]).with_http_config(self._http_config(proxy)).build()
        if service == "tms":  # one endpoint per site (tms_endpoint), domain-scoped
            from huaweicloudsdktms.v1 import TmsClient

            cred = GlobalCredentials(ak, sk, self.domain_id)
            endpoint = tms_endpoint(self.region, self.config.get("tms_endpoint"))
            proxy = None
            if iam_endpoint:
                # the emulator: the site's host name, through the emulator as the proxy
                cred.with_iam_endpoint(iam_endpoint)
                endpoint, proxy = emulated_host(endpoint), iam_endpoint
            return TmsClient.new_builder().with_credentials(cred) \
                .with_http_config(self._http_config(proxy)).with_endpoints([endpoint]).build()
        if service == "iam":
            from huaweicloudsdkiam.v3 import IamClient
            from huaweicloudsdkiam.v3.region.iam_region import IamRegion

            cred = GlobalCredentials(ak, sk, self._domain_id)
            builder = IamClient.new_builder().with_credentials(cred) \
                .with_http_config(self._http_config())
            if iam_endpoint:
                cred.with_iam_endpoint(iam_endpoint)
                builder = builder.with_endpoints([iam_endpoint])
            else:
                builder = builder.with_region(IamRegion.value_of(self.region))
            return builder.build()
        module, cls_name, region_mod = {
            "ecs": ("huaweicloudsdkecs.v2", "EcsClient", "huaweicloudsdkecs.v2.region.ecs_region"),
            "vpc": ("huaweicloudsdkvpc.v2", "VpcClient", "huaweicloudsdkvpc.v2.region.vpc_region"),
            "eip": ("huaweicloudsdkeip.v2", "EipClient", "huaweicloudsdkeip.v2.region.eip_region"),
            "eip3": ("huaweicloudsdkeip.v3", "EipClient",
                     "huaweicloudsdkeip.v3.region.eip_region"),
            "nat": ("huaweicloudsdknat.v2", "NatClient", "huaweicloudsdknat.v2.region.nat_region"),
            "ims": ("huaweicloudsdkims.v2", "ImsClient", "huaweicloudsdkims.v2.region.ims_region"),
            "kps": ("huaweicloudsdkkps.v3", "KpsClient", "huaweicloudsdkkps.v3.region.kps_region"),
        }[service]
        import importlib

        cls = getattr(importlib.import_module(module), cls_name)
        cred = BasicCredentials(ak, sk, self.project_id)
        builder = cls.new_builder().with_credentials(cred).with_http_config(self._http_config())
        if self.endpoint:
            cred.with_iam_endpoint(self.endpoint)
            builder = builder.with_endpoints([self.endpoint])
        else:
            region_cls = getattr(importlib.import_module(region_mod),
                                 cls_name.replace("Client", "Region"))
            try:
                builder = builder.with_region(region_cls.value_of(self.region))
            except KeyError:
                raise ConfigError(f"provider.region: '{self.region}' is not a Huawei Cloud "
                                  f"region the {service.upper()} SDK knows",
                                  field="provider.region") from None
        return builder.build()

    def client(self, service: str) -> Any:
        with self._lock:
            if service not in self._clients:
                self._clients[service] = _silence(self._build(service))
            return self._clients[service]

    # calls ------------------------------------------------------------------------------
    def call(self, service: str, method: str, request: Any, *,
             recover: Callable[[], Any] | None = None, what: str | None = None,
             missing_ok: bool = False) -> Any:
        """Call ``service.method(request)`` with retries; raise our errors on failure.

        With ``missing_ok`` a "not found" answer (HTTP 404) returns None: for look-ups and
        for deletes of something that may already be gone."""
        client = self.client(service)
        fn = getattr(client, method)
        name = f"{service}.{method}"

        def once():
            self.counts[name] += 1
            try:
                return fn(request)
            except sdk_exc.ServiceResponseException as e:
                if missing_ok and e.status_code == 404:
                    return None
                raise

        try:
            return call_with_retry(once, what=what or name, policy=self.policy,
                                   recover=recover, on_retry=self.on_retry,
                                   checkpoint=self.checkpoint)
        except sdk_exc.SdkException as e:
            if service == "tms" and getattr(e, "status_code", None) == 401:
                # the other services took these credentials: the tag service is another
                # site's, where the account does not exist (TMS_SITE_OF)
                endpoint = tms_endpoint(self.region, self.config.get("tms_endpoint"))
                raise ConfigError(
                    f"provider.tms_endpoint: the tag service at {endpoint} does not know "
                    f"these credentials (401), which the other services of {self.region} "
                    "accepted: the account is on another Huawei Cloud site than the region "
                    "suggests; set tms_endpoint to your site's (https://tms.myhuaweicloud."
                    "com Chinese site, https://tms-intl.myhuaweicloud.com international, "
                    "https://tms.myhuaweicloud.eu Europe, a dedicated region's from its "
                    "administrator)", field="provider.tms_endpoint", value=endpoint) from None
            raise as_provider_error(e, what or name) from None

    def total_calls(self) -> int:
        return sum(self.counts.values())
