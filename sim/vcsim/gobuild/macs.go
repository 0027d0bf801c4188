package main

// vCenter-style MAC addresses. govmomi's simulator derives a NIC's MAC from the last three
// characters of the VM's BIOS UUID plus the NIC's unit number (VirtualMachine.generateMAC,
// OUI 00:0c:29): about 4,096 values, so a few hundred VMs share MACs, and a clone keeps
// its source's MACs. vCenter hands out unique addresses from 00:50:56:80:00:00 -
// 00:50:56:bf:ff:ff (its "assigned" addresses) and gives a clone new ones.
//
// The allocator works as a registry hook (registryHooks.UpdateObject): every change to a
// VM's device list (creation, clone, reconfigure, power operations) passes
// Registry.Update while the simulator holds the VM, and the VM's NICs are settled right
// there, before any client can read them:
//
//   - a NIC with addressType "manual" keeps the MAC it was given (even a duplicate);
//   - any other NIC added by the change (config.hardware.device[key] with op "add":
//     CreateVM_Task, the NICs a CloneVM_Task copies, ReconfigVM_Task adds) gets the next
//     free address of a counter running through the range: 00:50:56:80:00:01,
//     00:50:56:80:00:02, ... (deterministic for one sequence of requests); a MAC still
//     held by a NIC of any VM, manual ones included, is never handed out;
//   - a NIC that had an address keeps it across edits (the simulator regenerates an
//     edited NIC's MAC when the edit leaves macAddress empty) and power operations;
//   - a NIC that is not being added but holds none of ours yet (an edit turning a manual
//     NIC into an assigned one) keeps its MAC if that is a free address of the range, and
//     gets a new one otherwise;
//   - an empty addressType becomes "assigned"; "generated" and "assigned" stay as given;
//   - guest.net follows the NIC (deviceConfigId);
//   - a removed NIC or VM frees its address; the counter goes on, so it only comes back
//     after the other 4 million.

import (
	"fmt"
	"log"
	"net"
	"strings"
	"sync"

	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

const (
	macPrefix   = "00:50:56"
	macRangeLow = 0x800000 // the last three octets of 00:50:56:80:00:00
	macPoolSize = 0x400000 // 00:50:56:80:00:00 - 00:50:56:bf:ff:ff
)

type nicMAC struct {
	mac    string // lower case, colon separated
	manual bool
}

type macAllocator struct {
	mu   sync.Mutex
	next uint32                                            // offset into the range of the next candidate
	held map[string]int                                    // MAC -> NICs holding it
	vms  map[types.ManagedObjectReference]map[int32]nicMAC // VM -> device key -> its NIC's MAC
}

func newMACAllocator() *macAllocator {
	return &macAllocator{
		next: 1, // 00:50:56:80:00:00 reads like a placeholder
		held: map[string]int{},
		vms:  map[types.ManagedObjectReference]map[int32]nicMAC{},
	}
}

// macOf formats offset n of the range.
func macOf(n uint32) string {
	v := macRangeLow + n%macPoolSize
	return fmt.Sprintf("%s:%02x:%02x:%02x", macPrefix, v>>16&0xff, v>>8&0xff, v&0xff)
}

// inRange reports whether mac is one the allocator could hand out, in its canonical form
// (lower case, colon separated).
func inRange(mac string) bool {
	hw, err := net.ParseMAC(mac)
	return err == nil && len(hw) == 6 && hw.String() == mac &&
		hw[0] == 0x00 && hw[1] == 0x50 && hw[2] == 0x56 && hw[3] >= 0x80 && hw[3] <= 0xbf
}

// deviceChange reports whether changes touch vm's device list, and which device keys they
// add.
func deviceChange(changes []types.PropertyChange) (bool, map[int32]bool) {
	touched := false
	var added map[int32]bool
	for _, c := range changes {
		var f mo.Field
		if !f.FromString(c.Name) || f.Path != "config.hardware.device" {
			continue
		}
		touched = true
		if key, ok := f.Key.(int32); ok && c.Op == types.PropertyChangeOpAdd {
			if added == nil {
				added = map[int32]bool{}
			}
			added[key] = true
		}
	}
	return touched, added
}

// settle gives vm's NICs their MACs (see the file comment). The caller holds vm (the
// simulator's lock, or vm is not in the inventory yet).
func (a *macAllocator) settle(vm *mo.VirtualMachine, added map[int32]bool) {
	if vm.Config == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.vms[vm.Self]
	// The old entries stay counted until the end, so that no NIC of this VM is handed an
	// address another of its NICs keeps.
	now := map[int32]nicMAC{}
	for _, d := range vm.Config.Hardware.Device {
		nic, ok := d.(types.BaseVirtualEthernetCard)
		if !ok {
			continue
		}
		card := nic.GetVirtualEthernetCard()
		current := strings.ToLower(card.MacAddress)
		if strings.EqualFold(card.AddressType, string(types.VirtualEthernetCardMacTypeManual)) {
			now[card.Key] = nicMAC{mac: current, manual: true}
			a.hold(current)
			continue
		}
		mac := ""
		if prev, ok := old[card.Key]; ok && !added[card.Key] && !prev.manual {
			mac = prev.mac
		} else if !added[card.Key] && inRange(current) && a.held[current] == 0 {
			mac = current
		} else {
			mac = a.allocate()
		}
		if mac == "" {
			log.Printf("no free MAC address left in %s:80:00:00-%s:bf:ff:ff; %s keeps %s",
				macPrefix, macPrefix, vm.Self.Value, card.MacAddress)
			mac = current
		}
		if card.AddressType == "" {
			card.AddressType = string(types.VirtualEthernetCardMacTypeAssigned)
		}
		card.MacAddress = mac
		now[card.Key] = nicMAC{mac: mac}
		a.hold(mac)
		if vm.Guest != nil {
			for i := range vm.Guest.Net {
				if vm.Guest.Net[i].DeviceConfigId == card.Key {
					vm.Guest.Net[i].MacAddress = mac
				}
			}
		}
	}
	for _, e := range old {
		a.release(e.mac)
	}
	if len(now) == 0 {
		delete(a.vms, vm.Self)
		return
	}
	a.vms[vm.Self] = now
}

// allocate returns the next MAC of the range no NIC holds ("" when none is left); the
// caller holds mu.
func (a *macAllocator) allocate() string {
	for range macPoolSize {
		mac := macOf(a.next)
		a.next = (a.next + 1) % macPoolSize
		if a.held[mac] == 0 {
			return mac
		}
	}
	return ""
}

func (a *macAllocator) hold(mac string) {
	if mac != "" {
		a.held[mac]++
	}
}

func (a *macAllocator) release(mac string) {
	if a.held[mac] <= 1 {
		delete(a.held, mac)
		return
	}
	a.held[mac]--
}

// forget frees the MACs of a VM that left the inventory.
func (a *macAllocator) forget(vm types.ManagedObjectReference) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, e := range a.vms[vm] {
		a.release(e.mac)
	}
	delete(a.vms, vm)
}
