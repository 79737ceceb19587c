"""Workspaces: the network (VPC, subnet, security group) clusters of a cloud live in."""
