"""The `pool` controller (key: VsphereAgentPool): plan a pool's capacity and apply the plan.

Owns the controller and the pool capacity metrics (`reconcile`), what wakes it
(`watches`), the snapshot it reads from the informers' parsed records (`observed`), the
applier that creates and hands over VsphereAgents and prepares Agents, with the writes
it waits to see in the cache before planning again (`apply`, `vsphere_agent_create`),
the status it writes and how that status is paced (`status`, `status_pacing`) and its
`Planned`/`AgentsPrepared` reports (`plan_reports`). The decisions
themselves are pure and live in `reconcilers.planning`.

May import `agentforge.api`, `agentforge.kube`, `reconcilers.planning` and
`reconcilers.common`; not `agentforge.vsphere` (the pool controller makes no vCenter
call) and no other controller package.
"""
