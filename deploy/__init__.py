"""Deploying past one machine: the helm tool, object storage, the Kubernetes chart (deploy/helm/)."""
