"""The `spread-rules` controller (key: VsphereAgentPool): a spread pool's DRS rules converge."""
