"""One VM's life in vCenter: placement, creation, facts, markers, CD-ROM, tags, DRS rules."""
