"""Planning: the pure decisions of the `pool` controller, from a snapshot of facts to a plan.

Owns the facts extracted once per object version (`snapshot`), the matching of Agents to
VMs (`matching`), VM phases (`phases`), demand counts (`demand`), which VsphereAgent
serves which AgentMachine and which VMs are spare (`assignment`), clean-up and the bound
Agents that block it (`cleanup`), the pool's own conditions (`pool_conditions`),
deterministic names (`naming`), and the planner that combines them (`planner`;
`planner_actions` lists what a plan does and the Agent preparation it includes).

Everything here is a function of values and `now`: no network, no clock, no event
loop. It may import `agentforge.api`, `agentforge.redaction` and the standard library;
it may not import aiohttp, asyncio, pyVmomi, `agentforge.kube`, `agentforge.vsphere`
or any other reconcilers package (import-linter: "planning is pure"). Every controller
package may import it.
"""
