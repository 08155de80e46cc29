"""Kubernetes: the manifests `tfps k8s` renders, and the cluster a pod derives from its env."""
