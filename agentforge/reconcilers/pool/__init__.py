"""The `pool` controller (key: VsphereAgentPool): plan a pool's capacity and apply the plan.

Owns the controller (`pool`), what wakes it (`pool_watches`), the snapshot it reads
from the informers' parsed records (`pool_snapshot`), the applier that creates and hands
over VsphereAgents and prepares Agents (`pool_apply`, `vsphere_agent_create`), the
writes it waits to see in the cache before planning again (`expectations`), the
status it writes and how that status is paced (`pool_status`, `status_pacing`), its
`Planned`/`AgentsPrepared` reports (`plan_reports`) and the pool capacity metrics
(`metrics`). The decisions themselves are pure and live in `reconcilers.planning`.

May import `agentforge.api`, `agentforge.kube`, `reconcilers.planning` and
`reconcilers.common`; not `agentforge.vsphere` (the pool controller makes no vCenter
call) and no other controller package.
"""
