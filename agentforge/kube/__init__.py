"""The operator runtime: a Kubernetes client, informers, work queues and controllers.

Knows nothing of vSphere. Import modules, not names, and qualify at call sites
(`from agentforge.kube import queue` -> `queue.WorkQueue`):

* `config`     where the apiserver is and how to authenticate (kubeconfig/in-cluster)
* `configprobe` runs kubernetes_asyncio's loaders in a child process (saves ~40 MB)
* `client`     raw-JSON REST client keyed by `agentforge.api.kinds.Kind`
* `transport`  the shared aiohttp session, retries and request metrics under it
* `errors`     typed API errors; transport failures kept apart from NotFound
* `watch`      one watch stream of parsed events
* `store`      the indexed cache, `ObjectKey`, and how observations change it (the
  handler events they produce)
* `pages`      LIST pages decoded to the fields the cache keeps (msgspec)
* `informer`   LIST+WATCH reflector feeding a store and event handlers
* `queue`      client-go work-queue semantics
* `controller` informer events -> keys -> queue -> reconcile workers
* `events`     aggregated, rate-limited core/v1 Events (`event_correlator`: which ones)
* `condition_log` a problem logged when it starts and when it clears
* `leader`     Lease leader election
* `access_review` TokenReview + SubjectAccessReview with TTL caches (who may read /metrics)
"""
