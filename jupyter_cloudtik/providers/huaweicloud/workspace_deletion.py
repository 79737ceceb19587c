"""Deleting a huaweicloud workspace: in dependency order, idempotent (a resource already
gone is fine), waiting out what is still in use while its dependents drain (a mixin of
``HuaweiCloudWorkspaceProvider``, workspace.py)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...core.errors import ProviderError
from .account import wait_until
from .userdata import list_keys

if TYPE_CHECKING:
    from ...core.operations import OperationContext

log = logging.getLogger("jupyter_cloudtik.huaweicloud")

#: the prefix of every object jupyter_cloudtik puts in a workspace bucket itself
OUR_PREFIX = "cloudtik/"


class WorkspaceDeletion:
    """``delete_workspace`` and its steps; needs the ``find_*`` lookups, ``clients``,
    ``names``, ``ctx``, ``_use``, ``_progress`` and ``on_resource`` of the workspace
    provider."""

    def _delete(self, service: str, method: str, request: Any, what: str,
                timeout: float = 600) -> None:
        """Delete something that may still be in use while its dependents drain.

        The cloud deletes asynchronously: a server's port outlives its delete call until
        the ECS job ends, a SNAT rule and a NAT gateway stay PENDING_DELETE.  Until then
        deleting what they use (subnet, security group, NAT gateway, EIP, VPC) answers 409
        "in use"; that is waited out (growing pauses, bounded), never given up half-way."""
        def attempt():
            try:
                self.clients.call(service, method, request, missing_ok=True, what=what)
            except ProviderError as e:
                if e.details.get("status") == 409:
                    log.info("huaweicloud: %s: still in use (%s); waiting", what,
                             e.details.get("code"))
                    return None
                raise
            return True

        wait_until(attempt, what=f"{what} (in use by resources being deleted)",
                   timeout=timeout, first=0.2, most=5.0,
                   checkpoint=self.ctx.checkpoint if self.ctx else None)

    def delete_workspace(self, ctx: OperationContext | None, delete_storage: bool = True,
                         rolling_back: bool = False) -> None:
        self._use(ctx)
        c, n = self.clients, self.names
        base = 0.9 if rolling_back else 0.0
        span = 0.1 if rolling_back else 1.0

        def step(name: str, message: str, i: int) -> None:
            self._progress(name, message, base + span * i / 8)

        if delete_storage and not rolling_back and self.bucket_exists():
            # refuse before anything is torn down, not after the network is gone
            self._check_bucket_is_ours(self.bucket())
        vpc = self.find_vpc()
        step("peering", "VPC peering", 0)
        peering = self.find_peering()
        if peering is not None:
            self._delete_peering(peering, vpc)
        self.on_resource("peering_id", None)

        step("nat", "SNAT rules, NAT gateway and its EIP", 1)
        nat = self.find_nat()
        if nat is not None:
            self._delete_nat(nat)
        self.on_resource("nat_id", None)
        eip = self.find_eip(n["nat_eip"])
        if eip is not None:
            from huaweicloudsdkeip.v2 import DeletePublicipRequest

            self._delete("eip", "delete_publicip", DeletePublicipRequest(publicip_id=eip.id),
                         "delete the NAT gateway's EIP")
        self.on_resource("nat_eip_id", None)

        step("security-group", "security group", 3)
        sg = self.find_security_group()
        if sg is not None:
            from huaweicloudsdkvpc.v2 import DeleteSecurityGroupRequest

            self._delete("vpc", "delete_security_group",
                         DeleteSecurityGroupRequest(security_group_id=sg.id),
                         "delete the security group")
        self.on_resource("security_group_id", None)

        step("subnets", "subnets and VPC", 4)
        if vpc is not None:
            from huaweicloudsdkvpc.v2 import DeleteSubnetRequest, DeleteVpcRequest

            for kind, s in self.find_subnets(vpc.id).items():
                self._delete("vpc", "delete_subnet", DeleteSubnetRequest(
                    vpc_id=vpc.id, subnet_id=s.id), f"delete the {kind}")
                self.on_resource(kind + "_id", None)
            wait_until(lambda: not self.find_subnets(vpc.id), what="the subnets going away",
                       timeout=300, checkpoint=ctx.checkpoint if ctx else None)
            self._delete("vpc", "delete_vpc", DeleteVpcRequest(vpc_id=vpc.id),
                         "delete the VPC")
        self.on_resource("vpc_id", None)

        step("identity", "IAM agencies", 5)
        from huaweicloudsdkiam.v3 import DeleteAgencyRequest

        for key in ("head_agency", "worker_agency"):
            agency = self.find_agency(key)
            if agency is not None:
                c.call("iam", "delete_agency", DeleteAgencyRequest(agency_id=agency.id),
                       missing_ok=True, what=f"delete the {key.replace('_', ' ')}")
            self.on_resource(key, None)
        policy = self.find_obs_policy()
        if policy is not None:
            from huaweicloudsdkiam.v3 import DeleteCustomPolicyRequest

            c.call("iam", "delete_custom_policy", DeleteCustomPolicyRequest(role_id=policy.id),
                   missing_ok=True, what="delete the nodes' OBS policy")
        self.on_resource("obs_policy", None)

        step("keypair", "cluster key pair", 6)
        if self.find_keypair() is not None:
            from huaweicloudsdkkps.v3 import DeleteKeypairRequest

            c.call("kps", "delete_keypair", DeleteKeypairRequest(keypair_name=n["keypair"]),
                   missing_ok=True, what="delete the key pair")
        self.on_resource("keypair", None)

        if delete_storage:
            step("storage", "managed OBS bucket", 7)
            if self.bucket_exists():
                from huaweicloudsdkobs.v1 import DeleteBucketRequest

                bucket = self.bucket()
                self._empty_our_prefix(bucket)
                try:
                    c.call("obs", "delete_bucket", DeleteBucketRequest(bucket_name=bucket),
                           missing_ok=True, what=f"delete the OBS bucket {bucket}")
                except ProviderError as e:
                    if e.details.get("status") == 409:
                        raise ProviderError(
                            f"the OBS bucket {bucket} is not empty; empty it, or delete the "
                            "workspace with --keep-storage to keep it") from None
                    raise
            self.on_resource("bucket", None)

    def _check_bucket_is_ours(self, bucket: str) -> list[str]:
        """The bucket's keys, all under our own prefix; else refuse, naming what is not."""
        keys = list_keys(self.clients, bucket, None, missing_ok=False,
                         what=f"list the objects of the OBS bucket {bucket}")
        foreign = [k for k in keys if not k.startswith(OUR_PREFIX)]
        if foreign:
            raise ProviderError(
                f"the OBS bucket {bucket} holds {len(foreign)} object(s) that "
                f"jupyter_cloudtik did not put there (e.g. "
                f"{', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}); move or "
                "delete them, or delete the workspace with --keep-storage to keep the "
                "bucket", field="bucket", value=bucket)
        return keys

    def _empty_our_prefix(self, bucket: str) -> None:
        """Delete what jupyter_cloudtik itself put in the bucket (``cloudtik/``: clusters'
        TLS material, manifests and wheels, left when a cluster's ``down`` never
        finished); a bucket holding anything else is refused, untouched."""
        from huaweicloudsdkobs.v1 import DeleteObjectRequest

        ours = self._check_bucket_is_ours(bucket)
        if ours:
            log.info("huaweicloud: deleting %d object(s) under %s in %s", len(ours),
                     OUR_PREFIX, bucket)
        for key in ours:
            self.clients.call("obs", "delete_object", DeleteObjectRequest(
                bucket_name=bucket, object_key=key), missing_ok=True,
                what=f"delete {key} from the OBS bucket {bucket}")

    def _delete_nat(self, nat) -> None:
        from huaweicloudsdknat.v2 import (
            DeleteNatGatewayRequest,
            DeleteNatGatewaySnatRuleRequest,
            ListNatGatewaySnatRulesRequest,
        )

        c = self.clients

        def rules():
            return c.call("nat", "list_nat_gateway_snat_rules", ListNatGatewaySnatRulesRequest(
                nat_gateway_id=[nat.id])).snat_rules or []

        for r in rules():
            if r.status == "PENDING_DELETE":
                continue
            c.call("nat", "delete_nat_gateway_snat_rule", DeleteNatGatewaySnatRuleRequest(
                nat_gateway_id=nat.id, snat_rule_id=r.id), missing_ok=True,
                what="delete a SNAT rule")
        # SNAT rules go asynchronously; the gateway refuses deletion until they are gone
        wait_until(lambda: not rules(), what="the SNAT rules going away", timeout=600,
                   checkpoint=self.ctx.checkpoint if self.ctx else None)
        if nat.status != "PENDING_DELETE":
            self._delete("nat", "delete_nat_gateway",
                         DeleteNatGatewayRequest(nat_gateway_id=nat.id),
                         "delete the NAT gateway")
        wait_until(lambda: self.find_nat() is None, what="the NAT gateway going away",
                   timeout=600, checkpoint=self.ctx.checkpoint if self.ctx else None)

    def _delete_peering(self, peering, vpc) -> None:
        from huaweicloudsdkvpc.v2 import (
            DeleteVpcPeeringRequest,
            DelRouteTableRoute,
            ListRouteTablesRequest,
            RouteTableRouteAction,
            ShowRouteTableRequest,
            UpdateRouteTableReq,
            UpdateRoutetableReqBody,
            UpdateRouteTableRequest,
        )

        c = self.clients
        for vpc_id in (peering.request_vpc_info.vpc_id, peering.accept_vpc_info.vpc_id):
            for rt in c.call("vpc", "list_route_tables",
                             ListRouteTablesRequest(vpc_id=vpc_id)).routetables:
                full = c.call("vpc", "show_route_table",
                              ShowRouteTableRequest(routetable_id=rt.id)).routetable
                drop = [DelRouteTableRoute(type="peering", destination=r.destination)
                        for r in (full.routes or []) if r.nexthop == peering.id]
                if drop:
                    c.call("vpc", "update_route_table", UpdateRouteTableRequest(
                        routetable_id=rt.id, body=UpdateRoutetableReqBody(
                            routetable=UpdateRouteTableReq(
                                routes=RouteTableRouteAction(_del=drop)))),
                        what="remove a peering route")
        c.call("vpc", "delete_vpc_peering", DeleteVpcPeeringRequest(peering_id=peering.id),
               missing_ok=True, what="delete the VPC peering")
