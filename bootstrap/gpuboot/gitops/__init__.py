"""The GitOps handoff: the repository Argo CD takes the cluster over from, and the tenants' bundles in it."""
