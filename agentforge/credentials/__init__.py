"""vSphere credentials from Kubernetes Secrets, process-wide: the Secret's rules, the cache."""
