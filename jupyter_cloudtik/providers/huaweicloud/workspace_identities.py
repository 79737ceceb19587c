"""The identities of a huaweicloud workspace's nodes: the IAM agencies they run as and
the custom policy that lets them reach the workspace bucket and nothing else (a mixin of
``HuaweiCloudWorkspaceProvider``, workspace.py)."""

from __future__ import annotations

from typing import Any

# Least privilege: what runs on a node only reads and writes the workspace bucket (the
# Dask runtime's wheels and TLS certificate, the storage mount); nothing on a node calls
# ECS, VPC or IAM (scaling is driven from the client), so no node holds ECS rights.
# Without managed storage the agencies hold no role at all.  With it, both hold one custom
# policy that names the workspace bucket and its objects and nothing else (IAM "Creating a
# Custom Policy for Cloud Services", https://support.huaweicloud.com/en-us/api-iam/iam_02_0013.html:
# Version "1.1", at most 8 statements of at most 100 actions, Resource
# "service:region:account-id:resource-type:path"), not the account-wide OBS OperateAccess.
OBS_NODE_ACTIONS = [
    "obs:bucket:HeadBucket", "obs:bucket:ListBucket", "obs:bucket:ListBucketMultipartUploads",
    "obs:object:GetObject", "obs:object:PutObject", "obs:object:DeleteObject",
    "obs:object:AbortMultipartUpload", "obs:object:ListMultipartUploadParts",
]


class WorkspaceIdentities:
    """Creating the agencies and the OBS policy, and granting it; needs ``clients``,
    ``names``, ``workspace_name``, ``bucket()`` and ``find_agency`` of the workspace
    provider."""

    def _create_agency(self, key: str):
        from huaweicloudsdkiam.v3 import (
            CreateAgencyOption,
            CreateAgencyRequest,
            CreateAgencyRequestBody,
        )

        c = self.clients
        got = c.call("iam", "create_agency", CreateAgencyRequest(CreateAgencyRequestBody(
            agency=CreateAgencyOption(
                name=self.names[key], domain_id=c.domain_id, trust_domain_name="op_svc_ecs",
                duration="FOREVER",
                description=f"jupyter_cloudtik {key.split('_')[0]} nodes of workspace "
                            f"{self.workspace_name}"))),
            recover=lambda: self.find_agency(key), what=f"create the {key.replace('_', ' ')}")
        return getattr(got, "agency", got)

    def find_obs_policy(self):
        from huaweicloudsdkiam.v3 import ListCustomPoliciesRequest

        page = 1
        while True:
            got = self.clients.call("iam", "list_custom_policies", ListCustomPoliciesRequest(
                page=page, per_page=300)).roles or []
            for r in got:
                if r.display_name == self.names["obs_policy"]:
                    return r
            if len(got) < 300:
                return None
            page += 1

    def obs_policy_document(self) -> dict[str, Any]:
        """What the nodes may do: the bucket's own operations and its objects' (the runtime's
        wheels and TLS certificate, the storage mount), on this bucket only."""
        b = self.bucket()
        return {"Version": "1.1", "Statement": [{
            "Effect": "Allow", "Action": list(OBS_NODE_ACTIONS),
            "Resource": [f"obs:*:*:bucket:{b}", f"obs:*:*:object:{b}/*"]}]}

    def _create_obs_policy(self):
        from huaweicloudsdkiam.v3 import (
            CreateCloudServiceCustomPolicyRequest,
            CreateCloudServiceCustomPolicyRequestBody,
            ServicePolicy,
            ServicePolicyRoleOption,
            ServiceStatement,
        )

        doc = self.obs_policy_document()
        st = doc["Statement"][0]
        got = self.clients.call("iam", "create_cloud_service_custom_policy",
                                CreateCloudServiceCustomPolicyRequest(
            body=CreateCloudServiceCustomPolicyRequestBody(role=ServicePolicyRoleOption(
                display_name=self.names["obs_policy"], type="AX",
                description=f"jupyter_cloudtik nodes of workspace {self.workspace_name}: "
                            "its OBS bucket only",
                policy=ServicePolicy(version=doc["Version"], statement=[ServiceStatement(
                    effect=st["Effect"], action=st["Action"], resource=st["Resource"])])))),
            recover=self.find_obs_policy,
            what="create the nodes' OBS policy (the workspace bucket only)")
        return getattr(got, "role", got)

    def _grant_role(self, agency_id: str, role_id: str, display: str) -> None:
        from huaweicloudsdkiam.v3 import AssociateAgencyWithAllProjectsPermissionRequest

        c = self.clients
        c.call("iam", "associate_agency_with_all_projects_permission",
               AssociateAgencyWithAllProjectsPermissionRequest(
                   domain_id=c.domain_id, agency_id=agency_id, role_id=role_id),
               what=f"grant '{display}' to the agency")
