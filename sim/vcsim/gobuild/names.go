package main

// Unique VM names per folder, as vCenter keeps them. govmomi's simulator lets
// CreateVM_Task (and RegisterVM_Task) add a second VM of a name the folder already
// holds; vCenter fails the task with DuplicateName. vCenter also reserves the name when
// the create starts: a second create of that name fails while the first one's task is
// still running, before its VM is complete.
//
// The guard runs in the SOAP handler for CreateVM_Task, RegisterVM_Task and CloneVM_Task
// (on the destination folder and name), before the method's task exists:
//
//   - the folder holds an entity of that name, or a guarded creation of that name is in
//     flight in that folder: the call returns a task that fails with DuplicateName
//     (`object` is the entity holding the name; the folder while the first creation
//     still runs, since the simulator has no VM object before its task ends);
//   - otherwise the name is reserved for the folder until the call's task ends (a
//     successful task puts the VM into the folder before it ends, so no second create
//     can slip in between), or released at once when the call answers without a task.
//
// Scripted failures come first and reserve nothing (they change nothing). A task delay
// runs inside the guard: the name is reserved from the call on, through the delay.
// Creations the simulator makes internally (CloneVM_Task's own CreateVM) do not pass the
// SOAP handler and so are not guarded twice.

import (
	"path"
	"reflect"
	"strings"
	"time"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// nameKey is one VM name in one folder (as the simulator stores it: escaped).
type nameKey struct {
	folder types.ManagedObjectReference
	name   string
}

// guardedName returns the folder and name a create-like call would take, if m is one.
func guardedName(m *simulator.Method) (nameKey, bool) {
	switch req := m.Body.(type) {
	case *types.CreateVM_Task:
		return nameKey{folder: m.This, name: escapeName(req.Config.Name)}, req.Config.Name != ""
	case *types.RegisterVM_Task:
		name := req.Name
		if name == "" { // the simulator names the VM after the directory of its .vmx
			var p object.DatastorePath
			if !p.FromString(req.Path) {
				return nameKey{}, false
			}
			name = path.Dir(p.Path)
		}
		return nameKey{folder: m.This, name: escapeName(name)}, name != ""
	case *types.CloneVM_Task:
		return nameKey{folder: req.Folder, name: escapeName(req.Name)}, req.Name != ""
	}
	return nameKey{}, false
}

// escapeName escapes a VM name the way the simulator stores it (and vCenter does).
func escapeName(name string) string {
	name = strings.ReplaceAll(name, `%`, "%25")
	name = strings.ReplaceAll(name, `/`, "%2f")
	return strings.ReplaceAll(name, `\`, "%5c")
}

// guardName wraps the call m (dispatched to inner, or to its target when inner is nil)
// in the name guard; nil when m creates no named VM.
func (in *Injector) guardName(ctx *simulator.Context, m *simulator.Method, inner mo.Reference) mo.Reference {
	key, ok := guardedName(m)
	if !ok {
		return nil
	}
	if inner == nil {
		inner = ctx.Map.Get(m.This)
		if inner == nil {
			return nil // the simulator answers ManagedObjectNotFound itself
		}
	}
	if fault := in.reserveName(ctx, key); fault != nil {
		return &taskHooks{Self: m.This, in: in, fault: fault}
	}
	return &nameGuard{Self: m.This, in: in, key: key, inner: inner}
}

// reserveName reserves key, or returns the DuplicateName fault the call fails with.
// A reservation whose task has ended no longer counts (its goroutine may not have
// released it yet), so a client that saw the task end can reuse the name at once.
// Reserving before looking at the folder's children closes the window in which a
// creation of the same name finishes (its VM enters the folder, then its task ends)
// between the look and the reservation.
func (in *Injector) reserveName(ctx *simulator.Context, key nameKey) types.BaseMethodFault {
	for {
		in.mu.Lock()
		holder, taken := in.names[key]
		if !taken {
			in.names[key] = types.ManagedObjectReference{} // bound to the task once it exists
			in.mu.Unlock()
			break
		}
		in.mu.Unlock()
		if holder.Value == "" || !in.taskEnded(holder) {
			return &types.DuplicateName{Name: key.name, Object: key.folder}
		}
		in.releaseName(key, holder)
	}
	if child := childNamed(ctx, key); child != nil {
		in.releaseName(key, types.ManagedObjectReference{})
		return &types.DuplicateName{Name: key.name, Object: *child}
	}
	return nil
}

// releaseName drops key's reservation if task (zero: none yet) still holds it.
func (in *Injector) releaseName(key nameKey, task types.ManagedObjectReference) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if holder, ok := in.names[key]; ok && holder == task {
		delete(in.names, key)
	}
}

// bindName hands key's reservation to the task of the call that made it.
func (in *Injector) bindName(key nameKey, task types.ManagedObjectReference) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.names[key] = task
}

// taskEnded reports whether the task ref has ended (or is gone).
func (in *Injector) taskEnded(ref types.ManagedObjectReference) bool {
	task, ok := in.registry.Get(ref).(*simulator.Task)
	if !ok {
		return true
	}
	ended := false
	in.newContext().WithLock(task, func() {
		ended = task.Info.State == types.TaskInfoStateSuccess || task.Info.State == types.TaskInfoStateError
	})
	return ended
}

// childNamed returns the child of key's folder named key.name, if any.
func childNamed(ctx *simulator.Context, key nameKey) *types.ManagedObjectReference {
	folder, ok := ctx.Map.Get(key.folder).(*simulator.Folder)
	if !ok {
		return nil // not a folder: the simulator refuses the call itself
	}
	var children []types.ManagedObjectReference
	ctx.WithLock(folder, func() { children = append(children, folder.ChildEntity...) })
	for _, ref := range children {
		e, ok := ctx.Map.Get(ref).(mo.Entity)
		if !ok {
			continue
		}
		var name string
		ctx.WithLock(e, func() { name = e.Entity().Name })
		if name == key.name {
			return &ref
		}
	}
	return nil
}

// nameGuard stands in for the target of one guarded call (see overrideForCall): it runs
// the call on inner and keeps the name reserved until the call's task ends.
type nameGuard struct {
	Self  types.ManagedObjectReference
	in    *Injector
	key   nameKey
	inner mo.Reference
}

func (g *nameGuard) Reference() types.ManagedObjectReference { return g.Self }

func (g *nameGuard) CreateVMTask(ctx *simulator.Context, req *types.CreateVM_Task) soap.HasFault {
	return g.run(ctx, "CreateVMTask", req, func(f *soap.Fault) soap.HasFault { return &methods.CreateVM_TaskBody{Fault_: f} })
}

func (g *nameGuard) RegisterVMTask(ctx *simulator.Context, req *types.RegisterVM_Task) soap.HasFault {
	return g.run(ctx, "RegisterVMTask", req, func(f *soap.Fault) soap.HasFault { return &methods.RegisterVM_TaskBody{Fault_: f} })
}

func (g *nameGuard) CloneVMTask(ctx *simulator.Context, req *types.CloneVM_Task) soap.HasFault {
	return g.run(ctx, "CloneVMTask", req, func(f *soap.Fault) soap.HasFault { return &methods.CloneVM_TaskBody{Fault_: f} })
}

// run calls goMethod on inner (as the simulator dispatches it; the caller already holds
// the target's lock) and releases the name when the returned task ends.
func (g *nameGuard) run(ctx *simulator.Context, goMethod string, req any, failed func(*soap.Fault) soap.HasFault) soap.HasFault {
	method := reflect.ValueOf(g.inner).MethodByName(goMethod)
	if !method.IsValid() {
		g.in.releaseName(g.key, types.ManagedObjectReference{})
		return failed(simulator.Fault("", &types.MethodNotFound{Receiver: g.Self, Method: goMethod}))
	}
	args := []reflect.Value{reflect.ValueOf(req)}
	if method.Type().NumIn() == 2 {
		args = append([]reflect.Value{reflect.ValueOf(ctx)}, args...)
	}
	body := method.Call(args)[0].Interface().(soap.HasFault)
	ref, ok := returnedTask(body)
	if !ok {
		g.in.releaseName(g.key, types.ManagedObjectReference{})
		return body
	}
	g.in.bindName(g.key, ref)
	go g.in.releaseWhenDone(g.key, ref)
	return body
}

// returnedTask is the task reference a task method's response body carries.
func returnedTask(body soap.HasFault) (types.ManagedObjectReference, bool) {
	if body == nil || body.Fault() != nil {
		return types.ManagedObjectReference{}, false
	}
	res := reflect.ValueOf(body).Elem().FieldByName("Res")
	if !res.IsValid() || res.IsNil() {
		return types.ManagedObjectReference{}, false
	}
	ref, ok := res.Elem().FieldByName("Returnval").Interface().(types.ManagedObjectReference)
	return ref, ok && ref.Value != ""
}

// releaseWhenDone releases key once the task ref has ended (or vanished).
func (in *Injector) releaseWhenDone(key nameKey, ref types.ManagedObjectReference) {
	defer in.releaseName(key, ref)
	task, ok := in.registry.Get(ref).(*simulator.Task)
	if !ok {
		return
	}
	waitTask(in.newContext(), task)
}

// waitTask polls task until it has ended and returns its outcome. ctx must be a context
// of the caller's own (see Injector.newContext): the task's goroutine updates it under
// the request's context.
func waitTask(ctx *simulator.Context, task *simulator.Task) (types.AnyType, *types.LocalizedMethodFault) {
	for {
		var result types.AnyType
		var fault *types.LocalizedMethodFault
		done := false
		ctx.WithLock(task, func() {
			switch task.Info.State {
			case types.TaskInfoStateSuccess, types.TaskInfoStateError:
				done = true
				result = task.Info.Result
				if task.Info.Error != nil {
					copied := *task.Info.Error
					fault = &copied
				}
			}
		})
		if done {
			return result, fault
		}
		time.Sleep(10 * time.Millisecond)
	}
}
