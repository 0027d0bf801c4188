package main

// Registry callbacks that keep the simulator closer to vCenter where clients notice:
//
//   - A new VirtualMachine gets runtime.faultToleranceState "notConfigured" and
//     runtime.recordReplayState "inactive" (also in summary.runtime), as vCenter reports
//     for every VM without Fault Tolerance or record/replay. The simulator leaves both
//     enums empty, and pyVmomi refuses to deserialize an empty enum, so reading
//     `runtime` or `summary` of any VM would fail.
//   - A VirtualMachine whose devices change gets unique vCenter-style NIC MACs (macs.go).
//   - A VirtualMachine that leaves the inventory takes its door lock, questions and MACs with
//     it; a reconfigure it was holding fails with ManagedObjectNotFound. One that stops
//     running drops its door lock (the lock is the guest's).
//   - FileManager tasks (DeleteDatastoreFile_Task, MoveDatastoreFile_Task,
//     CopyDatastoreFile_Task) report the datacenter they work in as info.entity. The
//     simulator puts the FileManager there, which is no ManagedEntity: pyVmomi then
//     refuses to deserialize the task's info at all.

import (
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

type registryHooks struct {
	in *Injector
}

func (h *registryHooks) Reference() types.ManagedObjectReference {
	return types.ManagedObjectReference{Type: "AgentForgeRegistryHooks", Value: "agentforge-registry-hooks"}
}

func (h *registryHooks) PutObject(_ *simulator.Context, obj mo.Reference) {
	vm, ok := obj.(*simulator.VirtualMachine)
	if !ok {
		return
	}
	// The VM is brand new: nobody else holds or reads it yet.
	if vm.Runtime.FaultToleranceState == "" {
		vm.Runtime.FaultToleranceState = types.VirtualMachineFaultToleranceStateNotConfigured
	}
	if vm.Summary.Runtime.FaultToleranceState == "" {
		vm.Summary.Runtime.FaultToleranceState = types.VirtualMachineFaultToleranceStateNotConfigured
	}
	if vm.Runtime.RecordReplayState == "" {
		vm.Runtime.RecordReplayState = types.VirtualMachineRecordReplayStateInactive
	}
	if vm.Summary.Runtime.RecordReplayState == "" {
		vm.Summary.Runtime.RecordReplayState = types.VirtualMachineRecordReplayStateInactive
	}
}

// UpdateObject settles the MACs of a VM whose devices changed (macs.go) and drops a VM's
// door lock when it stops running: a lock is the guest's.
func (h *registryHooks) UpdateObject(_ *simulator.Context, obj mo.Reference, changes []types.PropertyChange) {
	vm, ok := obj.(*mo.VirtualMachine)
	if !ok {
		return
	}
	if touched, added := deviceChange(changes); touched {
		h.in.macs.settle(vm, added)
	}
	for _, c := range changes {
		if c.Name == "runtime.powerState" && c.Val != types.VirtualMachinePowerStatePoweredOn {
			h.in.mu.Lock()
			delete(h.in.locked, vm.Self)
			h.in.mu.Unlock()
			return
		}
	}
}

func (h *registryHooks) RemoveObject(ctx *simulator.Context, ref types.ManagedObjectReference) {
	if ref.Type != "VirtualMachine" {
		return
	}
	h.in.macs.forget(ref)
	h.in.mu.Lock()
	delete(h.in.locked, ref)
	queue := h.in.questions[ref]
	delete(h.in.questions, ref)
	delete(h.in.questionSeq, ref)
	h.in.mu.Unlock()
	for _, q := range queue {
		if q.pending != nil {
			fault := &types.ManagedObjectNotFound{Obj: ref}
			finishHeldTask(h.in.newContext(), q.pending.task, nil, localized(fault, "the virtual machine was removed"))
		}
	}
}

// fileManagerHooks runs the simulator's FileManager task methods, then names the
// datacenter as the task's entity (the root folder when the request names none).
type fileManagerHooks struct {
	Self types.ManagedObjectReference
	fm   *simulator.FileManager
}

func (h *fileManagerHooks) Reference() types.ManagedObjectReference { return h.Self }

func (h *fileManagerHooks) DeleteDatastoreFileTask(ctx *simulator.Context, req *types.DeleteDatastoreFile_Task) soap.HasFault {
	body := h.fm.DeleteDatastoreFileTask(ctx, req)
	if b, ok := body.(*methods.DeleteDatastoreFile_TaskBody); ok && b.Res != nil {
		setTaskEntity(ctx, b.Res.Returnval, req.Datacenter)
	}
	return body
}

func (h *fileManagerHooks) MoveDatastoreFileTask(ctx *simulator.Context, req *types.MoveDatastoreFile_Task) soap.HasFault {
	body := h.fm.MoveDatastoreFileTask(ctx, req)
	if b, ok := body.(*methods.MoveDatastoreFile_TaskBody); ok && b.Res != nil {
		setTaskEntity(ctx, b.Res.Returnval, req.SourceDatacenter)
	}
	return body
}

func (h *fileManagerHooks) CopyDatastoreFileTask(ctx *simulator.Context, req *types.CopyDatastoreFile_Task) soap.HasFault {
	body := h.fm.CopyDatastoreFileTask(ctx, req)
	if b, ok := body.(*methods.CopyDatastoreFile_TaskBody); ok && b.Res != nil {
		setTaskEntity(ctx, b.Res.Returnval, req.SourceDatacenter)
	}
	return body
}

// setTaskEntity points a task's info.entity at a datacenter (or the root folder). It runs
// before the response carrying the task's reference is sent, so no client sees the
// simulator's original value.
func setTaskEntity(ctx *simulator.Context, ref types.ManagedObjectReference, datacenter *types.ManagedObjectReference) {
	task, ok := ctx.Map.Get(ref).(*simulator.Task)
	if !ok {
		return
	}
	var entity mo.Reference
	if datacenter != nil {
		entity = ctx.Map.Get(*datacenter)
	}
	if entity == nil {
		if si, ok := ctx.Map.Get(vim25.ServiceInstance).(*simulator.ServiceInstance); ok {
			entity = ctx.Map.Get(si.Content.RootFolder)
		}
	}
	e, ok := entity.(mo.Entity)
	if !ok {
		return
	}
	// A context of our own: the task's goroutine shares the request's context, and the
	// simulator's locks are shared by everything holding the same context.
	own := &simulator.Context{Context: ctx.Context, Map: ctx.Map}
	var self types.ManagedObjectReference
	var name string
	own.WithLock(e, func() { self, name = e.Entity().Self, e.Entity().Name })
	own.WithLock(task, func() {
		own.Update(task, []types.PropertyChange{
			{Name: "info.entity", Val: self},
			{Name: "info.entityName", Val: name},
		})
	})
}
