"""The huaweicloud workspace: network, identities and storage that clusters share.

For a workspace NAME: a VPC; a public and a private subnet; a security group (members
talk to each other freely, SSH only from ``allowed_ssh_sources``, the Dask scheduler and
dashboard only from ``allowed_dashboard_sources``); a NAT gateway with its own EIP and SNAT
rules so private nodes reach out; optionally a VPC peering to the working VPC (same region
only — Huawei's VPC peering does not cross regions; that would need Cloud Connect, which is
not supported); IAM agencies for head and workers (nodes authenticate as the instance,
never with access keys); a managed OBS bucket.

Every step looks its resource up by name before creating it and, if a create's answer was
lost, looks again before retrying, so running ``create`` again finishes a half-made
workspace and never makes duplicates.  A create that fails on a workspace that was never
ready deletes what exists of it (rollback).  ``delete`` removes in dependency order and is
idempotent: a resource already gone is fine.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import TYPE_CHECKING, Any, ClassVar

from ...core.errors import CloudTikError, ConfigError, ProviderError
from ...core.features import feature_service
from ..base import TAG_CLUSTER_NAME, WorkspaceProvider
from .account import (
    bucket_name,
    make_clients,
    names,
    paged_marker,
    retry_reporter,
    wait_until,
)
from .limits import dns_servers
from .offers import eip_type
from .servers import TAG_WORKSPACE, list_servers
from .workspace_deletion import WorkspaceDeletion
from .workspace_identities import WorkspaceIdentities

if TYPE_CHECKING:
    from ...core.operations import OperationContext

log = logging.getLogger("jupyter_cloudtik.huaweicloud")

# opened to allowed_dashboard_sources: only ports that require the cluster's client
# certificate (mutual TLS): the scheduler, and the relay in front of the head's web UIs
# (Dask's dashboard, and the Spark master's UI chosen by ALPN: no port of its own), which
# themselves stay on the head's loopback (userdata.py)
DASK_PORTS = (8786, 8786)
DASHBOARD_TLS_PORTS = (8788, 8788)
SPARK_MASTER_PORT = 7077  # runtime/spark.py NODE_MASTER_PORT; its UI is behind the relay
CIDR_LIST = {"type": "array", "items": {"type": "string", "format": "cidr",
                                       "pattern": r"^[0-9.]+/[0-9]{1,2}$"}}

PROVIDER_PROPERTIES: dict[str, Any] = {
    "type": {"const": "huaweicloud"},
    "region": {"type": "string", "pattern": r"^[a-z]{2,}(-[a-z0-9]+)+$",
               "title": "Region", "description": "e.g. cn-north-4, ap-southeast-1"},
    "endpoint": {"type": "string", "pattern": r"^https?://",
                 "description": "One address for every service (the emulator, a private "
                                "deployment); default: the public endpoints of the region."},
    "obs_endpoint": {"type": "string", "pattern": r"^https?://"},
    "obs_proxy": {"type": "string", "pattern": r"^https?://"},
    "tms_endpoint": {"type": "string", "pattern": r"^https?://",
                     "description": "The tag service of the account's site; default: the "
                                    "Chinese site's for cn-* regions, the international "
                                    "site's for the others (the Europe site's and dedicated "
                                    "regions' as the SDK lists them)."},
    "project_id": {"type": "string", "minLength": 8},
    "profile": {"type": "string", "description": "Profile of the credentials file."},
    "availability_zone": {"type": "string"},
    "retry": {"type": "object", "additionalProperties": False, "properties": {
        "attempts": {"type": "integer", "minimum": 1, "maximum": 20},
        "base_delay": {"type": "number", "minimum": 0, "maximum": 60},
        "budget": {"type": "number", "minimum": 0, "maximum": 3600}}},
}


def subnet_prefix(vpc_cidr: str, kind: str) -> int:
    """The public subnet is a /24 (the heads, the NAT gateway); the private one, where the
    workers go, as large as /20 when the VPC allows it: a subnet holds its size less 5
    addresses the cloud keeps, so a /24 (251 servers) could not hold 1,000 workers."""
    vpc_prefix = ipaddress.ip_network(vpc_cidr).prefixlen
    return 24 if kind == "public_subnet" else min(max(vpc_prefix + 1, 20), 24)


class HuaweiCloudWorkspaceProvider(WorkspaceIdentities, WorkspaceDeletion, WorkspaceProvider):
    provider_type = "huaweicloud"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "title": "Huawei Cloud workspace",
        "additionalProperties": False,
        "required": ["region"],
        "properties": {
            **PROVIDER_PROPERTIES,
            "vpc_cidr": {"type": "string", "pattern": r"^[0-9.]+/[0-9]{1,2}$",
                         "description": "Private CIDR of the workspace VPC (/16 to /24)."},
            "allowed_ssh_sources": {**CIDR_LIST, "description": "Who may reach port 22."},
            "allowed_dashboard_sources": {
                **CIDR_LIST, "description": "Who may reach the Dask scheduler (8786) and "
                                            "the web UI relay (8788: Dask's dashboard, "
                                            "Spark's UI), both mutual TLS, at the head's "
                                            "EIP; default: the SSH sources."},
            "peer_vpc_id": {"type": "string", "description": "VPC of the machine you work "
                            "from, to peer with (same region only)."},
            "peer_region": {"type": "string"},
            "managed_storage": {"type": "boolean", "description": "Create an OBS bucket."},
            "dns_servers": {"type": "array", "minItems": 1, "maxItems": 5,
                            "items": {"type": "string", "format": "ipv4"},
                            "description": "Name servers of the workspace subnets; default: "
                                           "the region's private DNS servers (a subnet "
                                           "created without any has no name resolution)."},
            "nat_bandwidth": {"type": "integer", "minimum": 1, "maximum": 300},
            "credentials": {"type": "object", "description": "access_key, secret_key, "
                            "project_id: kept in the secret store, never recorded."},
        },
    }

    @classmethod
    def normalize_config(cls, provider_config: dict[str, Any]) -> dict[str, Any]:
        p = dict(provider_config)
        p.setdefault("vpc_cidr", "192.168.0.0/16")
        if p.get("region"):  # before anything is made: subnets need name servers
            dns_servers(p["region"], p.get("dns_servers"))
        try:
            net = ipaddress.ip_network(p["vpc_cidr"])
        except ValueError:
            raise ConfigError(f"provider.vpc_cidr: {p['vpc_cidr']!r} is not a CIDR block",
                              field="provider.vpc_cidr") from None
        if not net.is_private or not 16 <= net.prefixlen <= 23:
            raise ConfigError(f"provider.vpc_cidr: {net} must be a private block from /16 to "
                              "/23 (two /24 subnets are cut from it)", field="provider.vpc_cidr")
        for key in ("allowed_ssh_sources", "allowed_dashboard_sources"):
            for cidr in p.get(key) or []:
                try:
                    ipaddress.ip_network(cidr, strict=False)
                except ValueError:
                    raise ConfigError(f"provider.{key}: {cidr!r} is not a CIDR block",
                                      field=f"provider.{key}") from None
        p.setdefault("allowed_ssh_sources", [])
        p.setdefault("allowed_dashboard_sources", list(p["allowed_ssh_sources"]))
        p.setdefault("managed_storage", True)
        p.setdefault("nat_bandwidth", 5)
        if p.get("peer_region") and p["peer_region"] != p["region"]:
            raise ConfigError(
                f"provider.peer_region: '{p['peer_region']}' differs from the workspace region "
                f"'{p['region']}'; Huawei Cloud VPC peering only connects VPCs of one region "
                "(across regions Cloud Connect is needed, which jupyter_cloudtik does not "
                "support)", field="provider.peer_region")
        if p.get("peer_region") and not p.get("peer_vpc_id"):
            raise ConfigError("provider.peer_vpc_id: required with peer_region",
                              field="provider.peer_vpc_id")
        return p

    def __init__(self, provider_config, workspace_name, context) -> None:
        super().__init__(provider_config, workspace_name, context)
        self.names = names(workspace_name)
        self._clients = None
        self.ctx: OperationContext | None = None

    @property
    def clients(self):
        if self._clients is None:
            self._clients = make_clients(self.provider_config, self.context,
                                         self.workspace_name,
                                         on_retry=retry_reporter(self.ctx, log))
        return self._clients

    def _use(self, ctx: OperationContext | None) -> None:
        self.ctx = ctx
        if self._clients is not None:
            self._clients.on_retry = retry_reporter(ctx, log)
        if ctx is not None:
            self.clients.checkpoint = ctx.checkpoint

    def _progress(self, step: str, message: str, fraction: float, **data: Any) -> None:
        if self.ctx is not None:
            self.ctx.progress(step, message, fraction, **data)
            self.ctx.checkpoint()
        else:
            log.info("%s: %s", step, message)

    # look-ups -----------------------------------------------------------------------------
    def find_vpc(self):
        from huaweicloudsdkvpc.v2 import ListVpcsRequest

        c = self.clients
        for v in paged_marker(lambda m, n: c.call("vpc", "list_vpcs", ListVpcsRequest(
                marker=m, limit=n)).vpcs):
            if v.name == self.names["vpc"]:
                return v
        return None

    def find_subnets(self, vpc_id: str) -> dict[str, Any]:
        from huaweicloudsdkvpc.v2 import ListSubnetsRequest

        c = self.clients
        out = {}
        for s in paged_marker(lambda m, n: c.call("vpc", "list_subnets", ListSubnetsRequest(
                vpc_id=vpc_id, marker=m, limit=n)).subnets):
            for kind in ("public_subnet", "private_subnet"):
                if s.name == self.names[kind]:
                    out[kind] = s
        return out

    def find_security_group(self):
        from huaweicloudsdkvpc.v2 import ListSecurityGroupsRequest

        c = self.clients
        for g in paged_marker(lambda m, n: c.call("vpc", "list_security_groups",
                              ListSecurityGroupsRequest(marker=m, limit=n)).security_groups):
            if g.name == self.names["security_group"]:
                return g
        return None

    def find_nat(self):
        from huaweicloudsdknat.v2 import ListNatGatewaysRequest

        c = self.clients
        found = c.call("nat", "list_nat_gateways",
                       ListNatGatewaysRequest(name=self.names["nat"])).nat_gateways
        return found[0] if found else None

    def find_eip(self, alias: str):
        from huaweicloudsdkeip.v2 import ListPublicipsRequest

        c = self.clients
        for e in paged_marker(lambda m, n: c.call("eip", "list_publicips", ListPublicipsRequest(
                marker=m, limit=n)).publicips):
            if e.alias == alias:
                return e
        return None

    def find_peering(self):
        from huaweicloudsdkvpc.v2 import ListVpcPeeringsRequest

        found = self.clients.call("vpc", "list_vpc_peerings", ListVpcPeeringsRequest(
            name=self.names["peering"])).peerings
        return found[0] if found else None

    def find_agency(self, key: str):
        from huaweicloudsdkiam.v3 import ListAgenciesRequest

        c = self.clients
        found = c.call("iam", "list_agencies", ListAgenciesRequest(
            domain_id=c.domain_id, name=self.names[key])).agencies
        return found[0] if found else None

    def bucket(self) -> str:
        return bucket_name(self.workspace_name, self.clients.domain_id)

    def bucket_exists(self) -> bool:
        from huaweicloudsdkobs.v1 import GetBucketMetadataRequest

        got = self.clients.call("obs", "get_bucket_metadata",
                                GetBucketMetadataRequest(bucket_name=self.bucket()),
                                missing_ok=True)
        return got is not None

    def find_keypair(self):
        from huaweicloudsdkkps.v3 import ListKeypairDetailRequest

        got = self.clients.call("kps", "list_keypair_detail", ListKeypairDetailRequest(
            keypair_name=self.names["keypair"]), missing_ok=True)
        return got.keypair if got is not None else None

    # create -------------------------------------------------------------------------------
    def create_workspace(self, ctx: OperationContext, rollback: bool = True) -> dict[str, Any]:
        self._use(ctx)
        try:
            return self._create()
        except Exception as e:
            if not rollback or getattr(e, "nothing_made", False):
                raise
            message = getattr(e, "message", str(e))
            self._progress("rollback", f"creating failed ({message}); deleting what was made",
                           0.9, level="warning")
            try:
                self.delete_workspace(ctx, delete_storage=True, rolling_back=True)
            except Exception as e2:
                raise ProviderError(
                    f"{message}; the rollback did not finish either "
                    f"({getattr(e2, 'message', e2)}): run `workspace delete "
                    f"{self.workspace_name}` to remove what is left") from e
            if isinstance(e, CloudTikError):
                e.message += "; everything that was created was deleted again (rollback)"
                e.args = (e.message,)
            raise

    def _create(self) -> dict[str, Any]:
        from huaweicloudsdkvpc.v2 import CreateVpcOption, CreateVpcRequest, CreateVpcRequestBody

        p, c, n = self.provider_config, self.clients, self.names
        res: dict[str, Any] = {"region": c.region}
        self.on_resource("region", c.region)
        steps = 7 if p.get("peer_vpc_id") else 6
        if p.get("peer_vpc_id"):  # before anything is made: an overlap is a config error
            self._check_peer_cidr()

        # 0. storage first: its name is global across accounts and held for a while after
        # a delete, so it is the step most likely to be refused, and a refusal here leaves
        # no VPC, NAT gateway or agencies to roll back
        if p.get("managed_storage", True):
            self._progress("storage", "managed OBS bucket", 0.02)
            bucket = self.bucket()
            if not self.bucket_exists():
                self._create_bucket(bucket)
            self.on_resource("bucket", bucket)

        # 1. VPC
        self._progress("vpc", f"VPC {n['vpc']}", 0.05)
        vpc = self.find_vpc()
        if vpc is None:
            vpc = c.call("vpc", "create_vpc", CreateVpcRequest(CreateVpcRequestBody(
                vpc=CreateVpcOption(name=n["vpc"], cidr=p["vpc_cidr"],
                                    description=f"jupyter_cloudtik workspace "
                                                f"{self.workspace_name}"))),
                recover=self.find_vpc, what="create the workspace VPC")
            vpc = getattr(vpc, "vpc", vpc)
        self.on_resource("vpc_id", vpc.id)
        res["vpc_id"] = vpc.id
        vpc_cidr = vpc.cidr

        # 2. subnets
        self._progress("subnets", "public and private subnets", 1 / steps)
        subnets = self.find_subnets(vpc.id)
        used = [s.cidr for s in subnets.values()]
        for kind in ("public_subnet", "private_subnet"):
            if kind not in subnets:
                cidr = self._free_cidr(vpc_cidr, used, subnet_prefix(vpc_cidr, kind))
                used.append(cidr)
                subnets[kind] = self._create_subnet(vpc.id, kind, cidr)
            elif not (subnets[kind].primary_dns or subnets[kind].dns_list):
                self._repair_subnet_dns(vpc.id, kind, subnets[kind])
            self.on_resource(kind + "_id", subnets[kind].id)
            res[kind + "_id"] = subnets[kind].id
        wait_until(lambda: all(s.status == "ACTIVE" for s in self._refresh_subnets(subnets)),
                   what="the subnets becoming ACTIVE", timeout=300,
                   checkpoint=self.ctx.checkpoint if self.ctx else None)

        # 3. security group and its rules
        self._progress("security-group", f"security group {n['security_group']}", 2 / steps)
        sg = self.find_security_group() or self._create_security_group(vpc.id)
        self.on_resource("security_group_id", sg.id)
        res["security_group_id"] = sg.id
        self._ensure_rules(sg.id, vpc_cidr)

        # 4. NAT gateway, its EIP, SNAT rules
        self._progress("nat", f"NAT gateway {n['nat']} with an EIP", 3 / steps)
        nat = self.find_nat() or self._create_nat(vpc.id, subnets["public_subnet"].id)
        self.on_resource("nat_id", nat.id)
        res["nat_id"] = nat.id
        eip = self.find_eip(n["nat_eip"]) or self._create_eip()
        self.on_resource("nat_eip_id", eip.id)
        res["nat_eip_id"] = eip.id
        res["nat_eip_address"] = eip.public_ip_address
        self._wait_nat_active(nat.id)
        self._ensure_snat(nat.id, eip.id, [s.id for s in subnets.values()])

        step = 4
        if p.get("peer_vpc_id"):
            self._progress("peering", f"VPC peering with {p['peer_vpc_id']}", step / steps)
            step += 1
            res["peering_id"] = self._ensure_peering(vpc)
            self.on_resource("peering_id", res["peering_id"])

        # identities
        self._progress("identity", "IAM agencies for head and worker nodes", step / steps)
        step += 1
        policy_id = None
        if p.get("managed_storage", True):
            policy = self.find_obs_policy() or self._create_obs_policy()
            policy_id = policy.id
            self.on_resource("obs_policy", n["obs_policy"])
            res["obs_policy"] = n["obs_policy"]
        for key in ("head_agency", "worker_agency"):
            agency = self.find_agency(key) or self._create_agency(key)
            if policy_id:
                self._grant_role(agency.id, policy_id, n["obs_policy"])
            self.on_resource(key, n[key])
            res[key] = n[key]

        if p.get("managed_storage", True):
            res["bucket"] = self.bucket()  # made first (below: before the VPC)
        return res

    def _free_cidr(self, vpc_cidr: str, used: list[str], prefix: int) -> str:
        taken = [ipaddress.ip_network(u) for u in used]
        for net in ipaddress.ip_network(vpc_cidr).subnets(new_prefix=prefix):
            if not any(net.overlaps(t) for t in taken):
                return str(net)
        raise ConfigError(f"provider.vpc_cidr: {vpc_cidr} has no free /{prefix} left for a "
                          "subnet", field="provider.vpc_cidr")

    def _refresh_subnets(self, subnets: dict[str, Any]) -> list[Any]:
        from huaweicloudsdkvpc.v2 import ShowSubnetRequest

        out = []
        for kind, s in subnets.items():
            subnets[kind] = self.clients.call("vpc", "show_subnet",
                                              ShowSubnetRequest(subnet_id=s.id)).subnet
            out.append(subnets[kind])
        return out

    def _create_subnet(self, vpc_id: str, kind: str, cidr: str):
        from huaweicloudsdkvpc.v2 import (
            CreateSubnetOption,
            CreateSubnetRequest,
            CreateSubnetRequestBody,
        )

        gateway = str(next(ipaddress.ip_network(cidr).hosts()))
        # the VPC API leaves DNS empty unless given, and then nothing on the subnet resolves
        # names (PyPI, OBS): give the region's private DNS servers, as the console does
        dns = dns_servers(self.clients.region, self.provider_config.get("dns_servers"))
        got = self.clients.call("vpc", "create_subnet", CreateSubnetRequest(
            CreateSubnetRequestBody(subnet=CreateSubnetOption(
                name=self.names[kind], cidr=cidr, gateway_ip=gateway, vpc_id=vpc_id,
                primary_dns=dns[0], secondary_dns=dns[1] if len(dns) > 1 else None,
                dns_list=dns))),
            recover=lambda: self.find_subnets(vpc_id).get(kind),
            what=f"create the {kind.replace('_', ' ')}")
        return getattr(got, "subnet", got)

    def _repair_subnet_dns(self, vpc_id: str, kind: str, subnet) -> None:
        """A subnet made before jupyter_cloudtik gave DNS servers (or by hand) has none, and
        nothing on it resolves names: give it the region's (or ``dns_servers``) with the
        VPC API's update call ("Updating Subnet Information", vpc_subnet01_0004; ``name``
        is mandatory there, so the subnet's own is sent back). New servers get them."""
        from huaweicloudsdkvpc.v2 import (
            UpdateSubnetOption,
            UpdateSubnetRequest,
            UpdateSubnetRequestBody,
        )

        dns = dns_servers(self.clients.region, self.provider_config.get("dns_servers"))
        self._progress("subnets", f"the {kind.replace('_', ' ')} has no DNS servers: "
                       f"setting {', '.join(dns)}", 1 / 7)
        self.clients.call("vpc", "update_subnet", UpdateSubnetRequest(
            vpc_id=vpc_id, subnet_id=subnet.id, body=UpdateSubnetRequestBody(
                subnet=UpdateSubnetOption(
                    name=subnet.name, primary_dns=dns[0],
                    secondary_dns=dns[1] if len(dns) > 1 else None, dns_list=dns))),
            what=f"set the DNS servers of the {kind.replace('_', ' ')}")

    def _create_security_group(self, vpc_id: str):
        from huaweicloudsdkvpc.v2 import (
            CreateSecurityGroupOption,
            CreateSecurityGroupRequest,
            CreateSecurityGroupRequestBody,
        )

        got = self.clients.call("vpc", "create_security_group", CreateSecurityGroupRequest(
            CreateSecurityGroupRequestBody(security_group=CreateSecurityGroupOption(
                name=self.names["security_group"], vpc_id=vpc_id))),
            recover=self.find_security_group, what="create the security group")
        return getattr(got, "security_group", got)

    def wanted_rules(self, sg_id: str, vpc_cidr: str) -> list[dict[str, Any]]:
        p = self.provider_config
        rules = [{"direction": "ingress", "ethertype": "IPv4", "protocol": None,
                  "port_range_min": None, "port_range_max": None, "remote_ip_prefix": None,
                  "remote_group_id": sg_id}]
        # the Spark master (runtime spark): a driver elsewhere in the VPC (a notebook on
        # an ECS, a VPN's end) submits to it; never wider than the VPC's own block (the
        # cluster's own members already reach it through the rule above)
        rules.append({"direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
                      "port_range_min": SPARK_MASTER_PORT, "port_range_max": SPARK_MASTER_PORT,
                      "remote_ip_prefix": str(ipaddress.ip_network(vpc_cidr, strict=False)),
                      "remote_group_id": None})
        for cidr in p.get("allowed_ssh_sources") or []:
            rules.append({"direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
                          "port_range_min": 22, "port_range_max": 22,
                          "remote_ip_prefix": str(ipaddress.ip_network(cidr, strict=False)),
                          "remote_group_id": None})
        for cidr in p.get("allowed_dashboard_sources") or []:
            for lo, hi in (DASK_PORTS, DASHBOARD_TLS_PORTS):
                rules.append({"direction": "ingress", "ethertype": "IPv4", "protocol": "tcp",
                              "port_range_min": lo, "port_range_max": hi,
                              "remote_ip_prefix": str(ipaddress.ip_network(cidr,
                                                                           strict=False)),
                              "remote_group_id": None})
        return rules

    def _ensure_rules(self, sg_id: str, vpc_cidr: str) -> None:
        from huaweicloudsdkvpc.v2 import (
            CreateSecurityGroupRuleOption,
            CreateSecurityGroupRuleRequest,
            CreateSecurityGroupRuleRequestBody,
            ListSecurityGroupRulesRequest,
        )

        c = self.clients
        keys = ("direction", "protocol", "port_range_min", "port_range_max",
                "remote_ip_prefix", "remote_group_id")

        def existing():
            return [{k: getattr(r, k) for k in keys} for r in paged_marker(
                lambda m, n: c.call("vpc", "list_security_group_rules",
                                    ListSecurityGroupRulesRequest(security_group_id=sg_id,
                                                                  marker=m, limit=n))
                .security_group_rules)]

        have = existing()
        for rule in self.wanted_rules(sg_id, vpc_cidr):
            want = {k: rule[k] for k in keys}
            if want in have:
                continue

            def recover(want=want):
                return True if want in existing() else None

            c.call("vpc", "create_security_group_rule", CreateSecurityGroupRuleRequest(
                CreateSecurityGroupRuleRequestBody(security_group_rule=(
                    CreateSecurityGroupRuleOption(security_group_id=sg_id, **rule)))),
                recover=recover, what="add a security group rule")

    def _create_nat(self, vpc_id: str, subnet_id: str):
        from huaweicloudsdknat.v2 import (
            CreateNatGatewayOption,
            CreateNatGatewayRequest,
            CreateNatGatewayRequestBody,
        )

        got = self.clients.call("nat", "create_nat_gateway", CreateNatGatewayRequest(
            CreateNatGatewayRequestBody(nat_gateway=CreateNatGatewayOption(
                name=self.names["nat"], router_id=vpc_id, internal_network_id=subnet_id,
                spec="1", description=f"jupyter_cloudtik workspace {self.workspace_name}"))),
            recover=self.find_nat, what="create the NAT gateway")
        return getattr(got, "nat_gateway", got)

    def _wait_nat_active(self, nat_id: str) -> None:
        from huaweicloudsdknat.v2 import ShowNatGatewayRequest

        def active():
            return self.clients.call("nat", "show_nat_gateway", ShowNatGatewayRequest(
                nat_gateway_id=nat_id)).nat_gateway.status == "ACTIVE"

        wait_until(active, what="the NAT gateway becoming ACTIVE", timeout=600,
                   checkpoint=self.ctx.checkpoint if self.ctx else None)

    def _create_eip(self):
        from huaweicloudsdkeip.v2 import (
            CreatePublicipBandwidthOption,
            CreatePublicipOption,
            CreatePublicipRequest,
            CreatePublicipRequestBody,
        )

        alias = self.names["nat_eip"]
        got = self.clients.call("eip", "create_publicip", CreatePublicipRequest(
            CreatePublicipRequestBody(
                bandwidth=CreatePublicipBandwidthOption(
                    name=self.names["bandwidth"], share_type="PER",
                    size=int(self.provider_config.get("nat_bandwidth", 5))),
                publicip=CreatePublicipOption(type=eip_type(self.clients), alias=alias))),
            recover=lambda: self.find_eip(alias), what="create the NAT gateway's EIP")
        return getattr(got, "publicip", got)

    def _ensure_snat(self, nat_id: str, eip_id: str, subnet_ids: list[str]) -> None:
        from huaweicloudsdknat.v2 import (
            CreateNatGatewaySnatRuleOption,
            CreateNatGatewaySnatRuleRequest,
            CreateNatGatewaySnatRuleRequestOption,
            ListNatGatewaySnatRulesRequest,
        )

        c = self.clients

        def networks() -> set[str]:
            return {r.network_id for r in c.call("nat", "list_nat_gateway_snat_rules",
                    ListNatGatewaySnatRulesRequest(nat_gateway_id=[nat_id])).snat_rules}

        have = networks()
        for sid in subnet_ids:
            if sid in have:
                continue
            c.call("nat", "create_nat_gateway_snat_rule", CreateNatGatewaySnatRuleRequest(
                CreateNatGatewaySnatRuleRequestOption(snat_rule=CreateNatGatewaySnatRuleOption(
                    nat_gateway_id=nat_id, network_id=sid, floating_ip_id=eip_id))),
                recover=lambda sid=sid: True if sid in networks() else None,
                what="add a SNAT rule")

    def _peer_vpc(self):
        from huaweicloudsdkvpc.v2 import ShowVpcRequest

        c = self.clients
        peer_id = self.provider_config["peer_vpc_id"]
        got = c.call("vpc", "show_vpc", ShowVpcRequest(vpc_id=peer_id), missing_ok=True)
        if got is None:
            raise ConfigError(f"provider.peer_vpc_id: no VPC {peer_id} in region {c.region} "
                              "(peering works within one region only)",
                              field="provider.peer_vpc_id")
        return got.vpc

    def _check_peer_cidr(self) -> None:
        """Refuse a workspace CIDR that overlaps the peer VPC's.  Huawei Cloud creates a
        peering between overlapping VPCs and reports it ACTIVE, but no route can be added
        for an overlapping destination, so it silently does not route (VPC peering docs:
        "VPC peering connections between VPCs with overlapping CIDR blocks ... routes
        cannot take effect"); the workspace would look healthy.  192.168.0.0/16, our
        default, is also the console's default VPC CIDR: the likely clash."""
        peer = self._peer_vpc()
        ours = ipaddress.ip_network(self.provider_config["vpc_cidr"])
        theirs = ipaddress.ip_network(peer.cidr)
        if ours.overlaps(theirs):
            free = next(c for c in ("10.0.0.0/16", "172.16.0.0/16", "10.100.0.0/16")
                        if not theirs.overlaps(ipaddress.ip_network(c)))
            raise ConfigError(
                f"provider.vpc_cidr: {ours} overlaps the peer VPC {peer.id}'s {theirs}: a "
                "peering between them would not route (Huawei Cloud creates it anyway); "
                f"choose a vpc_cidr that does not overlap, e.g. {free}",
                field="provider.vpc_cidr", value=str(ours))

    def _ensure_peering(self, vpc) -> str:
        from huaweicloudsdkvpc.v2 import (
            AddRouteTableRoute,
            CreateVpcPeeringOption,
            CreateVpcPeeringRequest,
            CreateVpcPeeringRequestBody,
            ListRouteTablesRequest,
            RouteTableRouteAction,
            ShowRouteTableRequest,
            UpdateRouteTableReq,
            UpdateRoutetableReqBody,
            UpdateRouteTableRequest,
            VpcInfo,
        )

        c = self.clients
        peer = self._peer_vpc()
        peering = self.find_peering()
        if peering is None:
            got = c.call("vpc", "create_vpc_peering", CreateVpcPeeringRequest(
                CreateVpcPeeringRequestBody(peering=CreateVpcPeeringOption(
                    name=self.names["peering"], request_vpc_info=VpcInfo(vpc_id=peer.id),
                    accept_vpc_info=VpcInfo(vpc_id=vpc.id)))),
                recover=self.find_peering, what="create the VPC peering")
            peering = getattr(got, "peering", got)
        for own, other in ((vpc, peer), (peer, vpc)):
            for rt in c.call("vpc", "list_route_tables",
                             ListRouteTablesRequest(vpc_id=own.id)).routetables:
                full = c.call("vpc", "show_route_table",
                              ShowRouteTableRequest(routetable_id=rt.id)).routetable
                routes = full.routes or []
                if any(r.destination == other.cidr for r in routes):
                    continue
                c.call("vpc", "update_route_table", UpdateRouteTableRequest(
                    routetable_id=rt.id, body=UpdateRoutetableReqBody(routetable=(
                        UpdateRouteTableReq(routes=RouteTableRouteAction(add=[
                            AddRouteTableRoute(type="peering", destination=other.cidr,
                                               nexthop=peering.id)]))))),
                    what="add a route through the VPC peering")
        return peering.id

    def _create_bucket(self, bucket: str) -> None:
        from huaweicloudsdkobs.v1 import CreateBucketRequest, CreateBucketRequestBody

        try:
            self.clients.call("obs", "create_bucket", CreateBucketRequest(
                bucket_name=bucket, body=CreateBucketRequestBody(
                    location=self.clients.region)),
                recover=lambda: True if self.bucket_exists() else None,
                what=f"create the OBS bucket {bucket}")
        except ProviderError as e:
            status, code = e.details.get("status"), e.details.get("code")
            if status in (403, 409) and code != "BucketAlreadyOwnedByYou":
                # OBS bucket names are global: another account's bucket (403), or ours
                # deleted less than ~30 minutes ago, whose name OBS still holds (409)
                refused = ConfigError(
                    f"workspace {self.workspace_name!r}: the OBS bucket name {bucket} is not "
                    f"available ({' '.join(str(x) for x in (status, code) if x)}): OBS names "
                    "are global across accounts and a deleted bucket's name is held for "
                    "about 30 minutes; if this workspace was deleted just now, run create "
                    "again later, else choose another workspace name (or managed_storage: "
                    "false). Nothing was made", field="provider.managed_storage", value=bucket)
                refused.nothing_made = True  # the first step: no rollback to do
                raise refused from None
            raise

    # inspect --------------------------------------------------------------------------------
    def check_workspace_integrity(self) -> dict[str, str]:
        self._use(None)
        out: dict[str, str] = {}
        vpc = self.find_vpc()
        out["vpc"] = "ok" if vpc else "missing"
        subnets = self.find_subnets(vpc.id) if vpc else {}
        for kind in ("public_subnet", "private_subnet"):
            sub = subnets.get(kind)
            out[kind] = ("missing" if sub is None else "ok" if sub.primary_dns or
                         sub.dns_list else "no DNS servers: nodes cannot resolve names; "
                         f"`jupyter cloudtik workspace create {self.workspace_name}` sets them")
        out["security_group"] = "ok" if self.find_security_group() else "missing"
        nat = self.find_nat()
        out["nat_gateway"] = ("ok" if nat and nat.status == "ACTIVE" else
                              f"status {nat.status}" if nat else "missing")
        out["nat_eip"] = "ok" if self.find_eip(self.names["nat_eip"]) else "missing"
        if self.provider_config.get("peer_vpc_id"):
            out["peering"] = "ok" if self.find_peering() else "missing"
        for key in ("head_agency", "worker_agency"):
            out[key] = "ok" if self.find_agency(key) else "missing"
        if self.provider_config.get("managed_storage", True):
            out["obs_policy"] = "ok" if self.find_obs_policy() else "missing"
            out["bucket"] = "ok" if self.bucket_exists() else "missing"
        return out

    def get_workspace_info(self) -> dict[str, Any]:
        rec = feature_service("workspace_record")(self.context.store, self.workspace_name) or {}
        return rec.get("resources", {})

    def list_clusters(self) -> list[str]:
        self._use(None)
        servers = list_servers(self.clients, {TAG_WORKSPACE: self.workspace_name})

        return sorted({t.split("=", 1)[1] for s in servers for t in (s.tags or [])
                       if t.startswith(TAG_CLUSTER_NAME + "=")})
