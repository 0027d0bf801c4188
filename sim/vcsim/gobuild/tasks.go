package main

// Task methods under scripted failure or delay. A taskHooks stands in for the target of
// one call of a task method (see overrideForCall in hooks.go) and either
//
//   - returns a task that ends in the scripted fault, changing nothing else (fail), or
//   - returns a task that stays `running` for the scripted time and then does what the
//     real method does, ending as the real method's task ends (delay). Unlike the
//     simulator's TaskDelay, the wait holds no object lock, so the inventory stays
//     readable and other calls go on, as on a busy vCenter.
//
// The method set below is the list of task methods that can be failed or delayed
// (taskMethods is derived from it).

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

type taskHooks struct {
	Self  types.ManagedObjectReference
	in    *Injector
	fault types.BaseMethodFault // fail with this ...
	delay time.Duration         // ... or run real's method after this long
	real  mo.Reference
}

func (h *taskHooks) Reference() types.ManagedObjectReference { return h.Self }

// task starts the task a call of goMethod(req) returns.
func (h *taskHooks) task(ctx *simulator.Context, name, goMethod string, req any) types.ManagedObjectReference {
	if h.fault != nil {
		return failTask(ctx, h, name, h.fault)
	}
	held := startHeldTask(ctx, h, name)
	later := detachedContext(ctx)
	go func() {
		time.Sleep(h.delay)
		inner, fault := h.invoke(later, goMethod, req)
		if fault != nil {
			finishHeldTask(h.in.newContext(), held, nil, localized(fault, typeName(fault)))
			return
		}
		h.in.mirror(inner, held)
	}()
	return held.Self
}

// invoke calls the real object's method under its lock, as the simulator dispatches a
// call, and returns the task it started or the fault it answered with.
func (h *taskHooks) invoke(ctx *simulator.Context, goMethod string, req any) (types.ManagedObjectReference, types.BaseMethodFault) {
	method := reflect.ValueOf(h.real).MethodByName(goMethod)
	if !method.IsValid() {
		return types.ManagedObjectReference{}, &types.MethodNotFound{Receiver: h.Self, Method: goMethod}
	}
	args := []reflect.Value{reflect.ValueOf(req)}
	if method.Type().NumIn() == 2 {
		args = append([]reflect.Value{reflect.ValueOf(ctx)}, args...)
	}
	var body soap.HasFault
	ctx.WithLock(h.real, func() { body = method.Call(args)[0].Interface().(soap.HasFault) })
	if f := body.Fault(); f != nil {
		if fault, ok := f.VimFault().(types.BaseMethodFault); ok {
			return types.ManagedObjectReference{}, fault
		}
		return types.ManagedObjectReference{}, &types.SystemError{Reason: f.String}
	}
	res := reflect.ValueOf(body).Elem().FieldByName("Res")
	if !res.IsValid() || res.IsNil() {
		return types.ManagedObjectReference{}, &types.SystemError{Reason: fmt.Sprintf("%s returned no task", goMethod)}
	}
	ref, ok := res.Elem().FieldByName("Returnval").Interface().(types.ManagedObjectReference)
	if !ok {
		return types.ManagedObjectReference{}, &types.SystemError{Reason: fmt.Sprintf("%s returned no task", goMethod)}
	}
	return ref, nil
}

// detachedContext is a copy of a request's context for work done after the request: its
// own lock identity, no deadline, and a session whose registry is empty (the request's
// one holds the call's hook), so lookups fall through to the inventory.
func detachedContext(ctx *simulator.Context) *simulator.Context {
	c := *ctx
	c.Context = context.Background()
	if ctx.Session != nil {
		session := *ctx.Session
		session.Registry = simulator.NewRegistry()
		c.Session = &session
	}
	return &c
}

// failTask starts a task on entity that fails with fault.
func failTask(ctx *simulator.Context, entity mo.Reference, name string, fault types.BaseMethodFault) types.ManagedObjectReference {
	return simulator.CreateTask(entity, name, func(*simulator.Task) (types.AnyType, types.BaseMethodFault) {
		return nil, fault
	}).Run(ctx)
}

func (h *taskHooks) CreateVMTask(ctx *simulator.Context, req *types.CreateVM_Task) soap.HasFault {
	return &methods.CreateVM_TaskBody{Res: &types.CreateVM_TaskResponse{Returnval: h.task(ctx, "createVm", "CreateVMTask", req)}}
}

func (h *taskHooks) RegisterVMTask(ctx *simulator.Context, req *types.RegisterVM_Task) soap.HasFault {
	return &methods.RegisterVM_TaskBody{Res: &types.RegisterVM_TaskResponse{Returnval: h.task(ctx, "registerVm", "RegisterVMTask", req)}}
}

func (h *taskHooks) ReconfigVMTask(ctx *simulator.Context, req *types.ReconfigVM_Task) soap.HasFault {
	return &methods.ReconfigVM_TaskBody{Res: &types.ReconfigVM_TaskResponse{Returnval: h.task(ctx, "reconfigVm", "ReconfigVMTask", req)}}
}

func (h *taskHooks) PowerOnVMTask(ctx *simulator.Context, req *types.PowerOnVM_Task) soap.HasFault {
	return &methods.PowerOnVM_TaskBody{Res: &types.PowerOnVM_TaskResponse{Returnval: h.task(ctx, "powerOn", "PowerOnVMTask", req)}}
}

func (h *taskHooks) PowerOffVMTask(ctx *simulator.Context, req *types.PowerOffVM_Task) soap.HasFault {
	return &methods.PowerOffVM_TaskBody{Res: &types.PowerOffVM_TaskResponse{Returnval: h.task(ctx, "powerOff", "PowerOffVMTask", req)}}
}

func (h *taskHooks) ResetVMTask(ctx *simulator.Context, req *types.ResetVM_Task) soap.HasFault {
	return &methods.ResetVM_TaskBody{Res: &types.ResetVM_TaskResponse{Returnval: h.task(ctx, "reset", "ResetVMTask", req)}}
}

func (h *taskHooks) SuspendVMTask(ctx *simulator.Context, req *types.SuspendVM_Task) soap.HasFault {
	return &methods.SuspendVM_TaskBody{Res: &types.SuspendVM_TaskResponse{Returnval: h.task(ctx, "suspend", "SuspendVMTask", req)}}
}

func (h *taskHooks) DestroyTask(ctx *simulator.Context, req *types.Destroy_Task) soap.HasFault {
	return &methods.Destroy_TaskBody{Res: &types.Destroy_TaskResponse{Returnval: h.task(ctx, "destroy", "DestroyTask", req)}}
}

func (h *taskHooks) RenameTask(ctx *simulator.Context, req *types.Rename_Task) soap.HasFault {
	return &methods.Rename_TaskBody{Res: &types.Rename_TaskResponse{Returnval: h.task(ctx, "rename", "RenameTask", req)}}
}

func (h *taskHooks) CloneVMTask(ctx *simulator.Context, req *types.CloneVM_Task) soap.HasFault {
	return &methods.CloneVM_TaskBody{Res: &types.CloneVM_TaskResponse{Returnval: h.task(ctx, "cloneVm", "CloneVMTask", req)}}
}

func (h *taskHooks) RelocateVMTask(ctx *simulator.Context, req *types.RelocateVM_Task) soap.HasFault {
	return &methods.RelocateVM_TaskBody{Res: &types.RelocateVM_TaskResponse{Returnval: h.task(ctx, "relocateVm", "RelocateVMTask", req)}}
}

func (h *taskHooks) UpgradeVMTask(ctx *simulator.Context, req *types.UpgradeVM_Task) soap.HasFault {
	return &methods.UpgradeVM_TaskBody{Res: &types.UpgradeVM_TaskResponse{Returnval: h.task(ctx, "upgradeVm", "UpgradeVMTask", req)}}
}

func (h *taskHooks) CreateSnapshotTask(ctx *simulator.Context, req *types.CreateSnapshot_Task) soap.HasFault {
	return &methods.CreateSnapshot_TaskBody{Res: &types.CreateSnapshot_TaskResponse{Returnval: h.task(ctx, "createSnapshot", "CreateSnapshotTask", req)}}
}

func (h *taskHooks) RemoveAllSnapshotsTask(ctx *simulator.Context, req *types.RemoveAllSnapshots_Task) soap.HasFault {
	return &methods.RemoveAllSnapshots_TaskBody{Res: &types.RemoveAllSnapshots_TaskResponse{Returnval: h.task(ctx, "removeAllSnapshots", "RemoveAllSnapshotsTask", req)}}
}

func (h *taskHooks) MoveIntoFolderTask(ctx *simulator.Context, req *types.MoveIntoFolder_Task) soap.HasFault {
	return &methods.MoveIntoFolder_TaskBody{Res: &types.MoveIntoFolder_TaskResponse{Returnval: h.task(ctx, "moveIntoFolder", "MoveIntoFolderTask", req)}}
}

func (h *taskHooks) DeleteDatastoreFileTask(ctx *simulator.Context, req *types.DeleteDatastoreFile_Task) soap.HasFault {
	return &methods.DeleteDatastoreFile_TaskBody{Res: &types.DeleteDatastoreFile_TaskResponse{Returnval: h.task(ctx, "deleteDatastoreFile", "DeleteDatastoreFileTask", req)}}
}

func (h *taskHooks) MoveDatastoreFileTask(ctx *simulator.Context, req *types.MoveDatastoreFile_Task) soap.HasFault {
	return &methods.MoveDatastoreFile_TaskBody{Res: &types.MoveDatastoreFile_TaskResponse{Returnval: h.task(ctx, "moveDatastoreFile", "MoveDatastoreFileTask", req)}}
}

func (h *taskHooks) CopyDatastoreFileTask(ctx *simulator.Context, req *types.CopyDatastoreFile_Task) soap.HasFault {
	return &methods.CopyDatastoreFile_TaskBody{Res: &types.CopyDatastoreFile_TaskResponse{Returnval: h.task(ctx, "copyDatastoreFile", "CopyDatastoreFileTask", req)}}
}

func (h *taskHooks) SearchDatastoreTask(ctx *simulator.Context, req *types.SearchDatastore_Task) soap.HasFault {
	return &methods.SearchDatastore_TaskBody{Res: &types.SearchDatastore_TaskResponse{Returnval: h.task(ctx, "searchDatastore", "SearchDatastoreTask", req)}}
}

func (h *taskHooks) SearchDatastoreSubFoldersTask(ctx *simulator.Context, req *types.SearchDatastoreSubFolders_Task) soap.HasFault {
	return &methods.SearchDatastoreSubFolders_TaskBody{Res: &types.SearchDatastoreSubFolders_TaskResponse{Returnval: h.task(ctx, "searchDatastoreSubFolders", "SearchDatastoreSubFoldersTask", req)}}
}

func (h *taskHooks) PowerOnMultiVMTask(ctx *simulator.Context, req *types.PowerOnMultiVM_Task) soap.HasFault {
	return &methods.PowerOnMultiVM_TaskBody{Res: &types.PowerOnMultiVM_TaskResponse{Returnval: h.task(ctx, "powerOnMultiVm", "PowerOnMultiVMTask", req)}}
}

// taskMethods holds the SOAP names of the task methods taskHooks can stand in for,
// derived from its method set so the list cannot drift from the code.
var taskMethods = func() map[string]bool {
	out := map[string]bool{}
	t := reflect.TypeOf(&taskHooks{})
	for i := 0; i < t.NumMethod(); i++ {
		name := t.Method(i).Name
		if strings.HasSuffix(name, "Task") {
			out[strings.TrimSuffix(name, "Task")+"_Task"] = true
		}
	}
	return out
}()
