"""Keys waiting for vCenter: for a task to end or a slot to start one, for a login to end.

No worker waits on vCenter (docs/design/0005-task-model.md). A reconcile that started
a task, or found a login in flight, records its key here and returns; the session
registry reports the end and the key is enqueued again (`task_waits`, `login_waits`).
The task waiter itself (one PropertyCollector long poll) is `agentforge/vsphere/tasks/waiter.py`.

May import `agentforge.vsphere` and `agentforge.kube` (controller results, keys); no
controller package and not `reconcilers.common` (import-linter: the reconcilers' layers).
"""
