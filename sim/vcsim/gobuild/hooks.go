package main

// SOAP hooks. govmomi v0.56's simulator calls Registry.Handler before dispatching every
// SOAP method. The handler may return a fault, or an object to dispatch to instead of the
// registered one (method name "Foo_Task" -> Go method "FooTask", found by reflection).
//
// One catch: for a call with a session, the simulator then looks the target up again in
// the session (Session.Get), which falls back to the global registry and so would undo
// the substitution. overrideForCall therefore also points this request's session (a
// per-request copy of the session record) at a one-object registry holding the hook.
// Nothing global changes: the inventory, the property collector, locks and every other
// request keep seeing the simulator's own objects, and a hook lives for one call only.
// (Swapping wrappers into the global registry, the 0.24-era pattern, breaks the many
// places where the simulator type-asserts registry objects to *VirtualMachine.)
//
//   - ended sessions: the call fails with NotAuthenticated; a Login goes through as if
//     the client had no session, as on a vCenter that forgot it;
//   - scripted failures: the call fails (stage "call") or returns a task that fails
//     (stage "task") with the chosen fault, without touching the inventory (tasks.go);
//   - task delays: the task stays running for a while before the method runs (tasks.go);
//   - CreateVM_Task, RegisterVM_Task, CloneVM_Task: one VM name per folder, reserved
//     while the creation runs, as on vCenter (names.go);
//   - VirtualMachine.ReconfigVM_Task / AnswerVM: the guest-locked CD-ROM door;
//   - StorageResourceManager.RecommendDatastores: placement for a whole datastore cluster;
//   - SearchIndex.FindChild in a folder: a child without a name yet matches nothing
//     (the simulator's own FindChild panics on one and leaves a lock held);
//   - FileManager tasks: info.entity names a datacenter (see fidelity.go).

import (
	"fmt"
	"reflect"
	"sort"
	"time"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

func (in *Injector) handle(ctx *simulator.Context, m *simulator.Method) (mo.Reference, types.BaseMethodFault) {
	if s := ctx.Session; s != nil && in.sessionEnded(s) {
		if !sessionlessMethods[m.Name] {
			return nil, notAuthenticated(m.This, "the session was ended")
		}
		ctx.Session = nil // e.g. Login with a stale cookie: proceed as a client without a session
	}

	if ctx.Session != nil || sessionlessMethods[m.Name] {
		if rule := in.takeRule(m); rule != nil {
			fault := faultMakers[rule.Fault](m, rule.Message)
			if rule.Stage == stageCall {
				return nil, fault
			}
			return overrideForCall(ctx, &taskHooks{Self: m.This, in: in, fault: fault}), nil
		}
	}
	if ctx.Session == nil {
		return nil, nil // the simulator refuses unauthenticated calls itself
	}

	hook := in.hookFor(ctx, m)
	if delay := in.taskDelayFor(m.Name); delay > 0 && taskMethods[m.Name] {
		real := hook
		if real == nil {
			real = ctx.Map.Get(m.This)
		}
		if real != nil {
			hook = &taskHooks{Self: m.This, in: in, delay: delay, real: real}
		}
	}
	if guard := in.guardName(ctx, m, hook); guard != nil {
		hook = guard // outermost: the name is reserved from the call on, through a delay
	}
	if hook == nil {
		return nil, nil
	}
	return overrideForCall(ctx, hook), nil
}

// hookFor returns the object that implements m differently from the simulator, if any.
func (in *Injector) hookFor(ctx *simulator.Context, m *simulator.Method) mo.Reference {
	switch m.Name {
	case "ReconfigVM_Task", "AnswerVM":
		if vm, ok := ctx.Map.Get(m.This).(*simulator.VirtualMachine); ok {
			return &vmHooks{Self: m.This, vm: vm, in: in}
		}
	case "FindChild":
		if si, ok := ctx.Map.Get(m.This).(*simulator.SearchIndex); ok {
			return &searchIndexHooks{Self: m.This, si: si}
		}
	case "RecommendDatastores":
		if srm, ok := ctx.Map.Get(m.This).(*simulator.StorageResourceManager); ok {
			return &srmHooks{Self: m.This, srm: srm}
		}
	case "DeleteDatastoreFile_Task", "MoveDatastoreFile_Task", "CopyDatastoreFile_Task":
		if fm, ok := ctx.Map.Get(m.This).(*simulator.FileManager); ok {
			return &fileManagerHooks{Self: m.This, fm: fm}
		}
	}
	return nil
}

// overrideForCall makes hook the object this one call dispatches to (see the file
// comment). hook must not be a mo.Entity, so that Registry.Put leaves the real object's
// fields alone, and must carry the target's reference in a Self field, so that the
// simulator's per-object lock is the real object's lock.
func overrideForCall(ctx *simulator.Context, hook mo.Reference) mo.Reference {
	if ctx.Session != nil {
		registry := simulator.NewRegistry()
		registry.Put(hook)
		ctx.Session.Registry = registry
	}
	return hook
}

// ---- tasks held running ------------------------------------------------------------------

// startHeldTask registers a task on entity that stays `running` until finishHeldTask. Unlike
// simulator.Task.Run it holds no object lock while it waits, so the VM stays readable and
// AnswerVM can reach it.
func startHeldTask(ctx *simulator.Context, entity mo.Reference, name string) *simulator.Task {
	task := simulator.CreateTask(entity, name, nil)
	ctx.Map.Put(task) // assigns task.Self; TaskManager adds it to recentTask lists
	ctx.Map.AtomicUpdate(ctx, task, []types.PropertyChange{
		{Name: "info.key", Val: task.Self.Value},
		{Name: "info.task", Val: task.Self},
		{Name: "info.startTime", Val: time.Now()},
		{Name: "info.state", Val: types.TaskInfoStateRunning},
	})
	return task
}

// finishHeldTask completes a held task, unless a client cancelled it meanwhile.
func finishHeldTask(ctx *simulator.Context, task *simulator.Task, result types.AnyType, fault *types.LocalizedMethodFault) {
	ctx.WithLock(task, func() {
		if task.Info.State != types.TaskInfoStateRunning {
			return
		}
		state := types.TaskInfoStateSuccess
		var errVal types.AnyType
		if fault != nil {
			state = types.TaskInfoStateError
			errVal = *fault
		}
		ctx.Update(task, []types.PropertyChange{
			{Name: "info.completeTime", Val: time.Now()},
			{Name: "info.state", Val: state},
			{Name: "info.result", Val: result},
			{Name: "info.error", Val: errVal},
		})
	})
}

// mirror waits for the task inner (the simulator's, or one held by us) and completes
// outer with its outcome.
func (in *Injector) mirror(innerRef types.ManagedObjectReference, outer *simulator.Task) {
	ctx := in.newContext()
	inner, ok := in.registry.Get(innerRef).(*simulator.Task)
	if !ok {
		finishHeldTask(ctx, outer, nil, localized(&types.SystemError{Reason: "reconfigure task vanished"}, "SystemError"))
		return
	}
	result, fault := waitTask(ctx, inner)
	finishHeldTask(ctx, outer, result, fault)
}

// ---- the guest-locked CD-ROM door -------------------------------------------------------

type vmHooks struct {
	Self types.ManagedObjectReference
	vm   *simulator.VirtualMachine
	in   *Injector
}

func (w *vmHooks) Reference() types.ManagedObjectReference { return w.Self }

// ReconfigVMTask holds a reconfigure that disconnects a CD-ROM whose door the guest locked:
// the task stays running and the VM asks msg.cdromdisconnect.locked until AnswerVM.
func (w *vmHooks) ReconfigVMTask(ctx *simulator.Context, req *types.ReconfigVM_Task) soap.HasFault {
	vm := w.vm
	if busy := w.in.pendingOf(w.Self); busy != nil {
		fault := &types.TaskInProgress{Task: busy.task.Self}
		ref := failTask(ctx, vm, "reconfigVm", fault)
		return &methods.ReconfigVM_TaskBody{Res: &types.ReconfigVM_TaskResponse{Returnval: ref}}
	}
	changes := cdromChanges(object.VirtualDeviceList(vm.Config.Hardware.Device), &req.Spec)
	keys := disconnectedKeys(changes)
	if len(keys) == 0 || !w.in.doorLocked(vm) {
		return vm.ReconfigVMTask(ctx, req)
	}
	task := startHeldTask(ctx, vm, "reconfigVm")
	q := cdromLockedQuestion()
	q.pending = &pendingReconfig{task: task, req: req, keys: keys}
	w.in.enqueueQuestion(ctx, vm, q)
	return &methods.ReconfigVM_TaskBody{Res: &types.ReconfigVM_TaskResponse{Returnval: task.Self}}
}

// AnswerVM answers the question shown in runtime.question. For the CD-ROM lock question,
// "0" (Yes) runs the held reconfigure and "1" (No) fails it.
func (w *vmHooks) AnswerVM(ctx *simulator.Context, req *types.AnswerVM) soap.HasFault {
	body := new(methods.AnswerVMBody)
	q, next, fault, msg := w.in.answer(w.Self, req.QuestionId, req.AnswerChoice)
	if fault != nil {
		body.Fault_ = simulator.Fault(msg, fault)
		return body
	}
	var shown types.AnyType
	if next != nil {
		info := next.info
		shown = &info
	}
	ctx.Update(w.vm, []types.PropertyChange{{Name: "runtime.question", Val: shown}})

	if p := q.pending; p != nil {
		if req.AnswerChoice == "0" {
			// The door lock was overridden: the medium is out, the guest's lock is gone.
			w.in.unlockDoorHeld(w.Self)
			inner := w.vm.ReconfigVMTask(ctx, p.req).(*methods.ReconfigVM_TaskBody)
			go w.in.mirror(inner.Res.Returnval, p.task)
		} else {
			reason := "The guest operating system has locked the CD-ROM door; the disconnect was declined."
			finishHeldTask(ctx, p.task, nil, localized(&types.GenericVmConfigFault{Reason: reason}, reason))
		}
	}
	body.Res = new(types.AnswerVMResponse)
	return body
}

// unlockDoorHeld releases the door of a VM whose object lock the caller already holds.
func (in *Injector) unlockDoorHeld(vm types.ManagedObjectReference) {
	in.mu.Lock()
	defer in.mu.Unlock()
	delete(in.locked, vm)
}

// cdromChange describes what one device change does to a CD-ROM.
type cdromChange struct {
	Key             int32  `json:"key"`
	Operation       string `json:"operation"`
	ConnectedBefore bool   `json:"connected_before"`
	ConnectedAfter  bool   `json:"connected_after"`
	BackingBefore   string `json:"backing_before"`
	BackingAfter    string `json:"backing_after"`
	Disconnects     bool   `json:"disconnects"`
}

// cdromChanges lists the CD-ROM changes of spec against the VM's current devices. A change
// "disconnects" when a connected CD-ROM ends up disconnected, removed, or with another
// backing (ejecting the medium): exactly when a guest's door lock gets in the way.
func cdromChanges(devices object.VirtualDeviceList, spec *types.VirtualMachineConfigSpec) []cdromChange {
	var out []cdromChange
	for _, dc := range spec.DeviceChange {
		change := dc.GetVirtualDeviceConfigSpec()
		want, ok := change.Device.(*types.VirtualCdrom)
		if !ok {
			continue
		}
		c := cdromChange{Key: want.Key, Operation: string(change.Operation), BackingAfter: describeBacking(want.Backing)}
		c.ConnectedAfter = want.Connectable != nil && want.Connectable.Connected
		have, _ := devices.FindByKey(want.Key).(*types.VirtualCdrom)
		if have != nil {
			c.ConnectedBefore = have.Connectable != nil && have.Connectable.Connected
			c.BackingBefore = describeBacking(have.Backing)
		}
		switch change.Operation {
		case types.VirtualDeviceConfigSpecOperationRemove:
			c.ConnectedAfter = false
			c.BackingAfter = ""
			c.Disconnects = c.ConnectedBefore
		case types.VirtualDeviceConfigSpecOperationEdit:
			if want.Connectable == nil && have != nil {
				c.ConnectedAfter = c.ConnectedBefore // connectable left as it was
			}
			c.Disconnects = c.ConnectedBefore && (!c.ConnectedAfter || c.BackingAfter != c.BackingBefore)
		}
		out = append(out, c)
	}
	return out
}

func disconnectedKeys(changes []cdromChange) []int32 {
	var keys []int32
	for _, c := range changes {
		if c.Disconnects {
			keys = append(keys, c.Key)
		}
	}
	return keys
}

// describeBacking names a CD-ROM backing: the ISO path, or the backing type and device.
func describeBacking(b types.BaseVirtualDeviceBackingInfo) string {
	switch x := b.(type) {
	case nil:
		return ""
	case types.BaseVirtualDeviceFileBackingInfo:
		return x.GetVirtualDeviceFileBackingInfo().FileName
	case types.BaseVirtualDeviceDeviceBackingInfo:
		return typeName(x) + ":" + x.GetVirtualDeviceDeviceBackingInfo().DeviceName
	case types.BaseVirtualDeviceRemoteDeviceBackingInfo:
		return typeName(x) + ":" + x.GetVirtualDeviceRemoteDeviceBackingInfo().DeviceName
	default:
		return typeName(x)
	}
}

// typeName is the vmodl name of a data object, e.g. VirtualCdromRemotePassthroughBackingInfo.
func typeName(v any) string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Name()
}

// ---- Storage DRS placement ---------------------------------------------------------------

// searchIndexHooks answers SearchIndex.FindChild in a folder without the simulator's
// panic: govmomi's FindChild names every child through entityName, which log.Panicf's
// on an entity without a name (a VM whose creation is still in flight was seen as one
// under task delays, in a 200-VM burst), and the panic unwinds past Registry.WithLock,
// which releases no lock on a panic: every later call needing the SearchIndex then
// hung, and the whole simulator with it. Here each child's name is read under its own
// lock and a child without one matches nothing, as on vCenter. Other entities (a
// datacenter, a cluster, a resource pool) go to the simulator's FindChild.
type searchIndexHooks struct {
	Self types.ManagedObjectReference
	si   *simulator.SearchIndex
}

func (s *searchIndexHooks) Reference() types.ManagedObjectReference { return s.Self }

func (s *searchIndexHooks) FindChild(ctx *simulator.Context, req *types.FindChild) soap.HasFault {
	if _, ok := ctx.Map.Get(req.Entity).(*simulator.Folder); !ok {
		return s.si.FindChild(ctx, req)
	}
	body := &methods.FindChildBody{Res: new(types.FindChildResponse)}
	if req.Name != "" { // (an unnamed child matches no name)
		body.Res.Returnval = childNamed(ctx, nameKey{folder: req.Entity, name: req.Name})
	}
	return body
}

type srmHooks struct {
	Self types.ManagedObjectReference
	srm  *simulator.StorageResourceManager
}

func (s *srmHooks) Reference() types.ManagedObjectReference { return s.Self }

// RecommendDatastores answers a placement request naming only a datastore cluster (no
// per-disk initialVmConfig) the way vCenter does: one recommendation per datastore of the
// cluster, most free space first. The simulator itself only recommends per disk.
func (s *srmHooks) RecommendDatastores(ctx *simulator.Context, req *types.RecommendDatastores) soap.HasFault {
	res := s.srm.RecommendDatastores(ctx, req)
	spec := req.StorageSpec.PodSelectionSpec
	if res.Fault() != nil || spec.StoragePod == nil || len(spec.InitialVmConfig) > 0 {
		return res
	}
	body := res.(*methods.RecommendDatastoresBody)
	pod, ok := ctx.Map.Get(*spec.StoragePod).(*simulator.StoragePod)
	if !ok {
		body.Res = nil
		body.Fault_ = simulator.Fault("", &types.ManagedObjectNotFound{Obj: *spec.StoragePod})
		return body
	}
	var podSelf types.ManagedObjectReference
	var children []types.ManagedObjectReference
	enabled := false
	ctx.WithLock(pod, func() {
		podSelf = pod.Self
		children = append(children, pod.ChildEntity...)
		enabled = pod.PodStorageDrsEntry != nil && pod.PodStorageDrsEntry.StorageDrsConfig.PodConfig.Enabled
	})
	if !enabled || len(children) == 0 {
		body.Res = nil
		body.Fault_ = simulator.Fault("Storage DRS is not enabled on the datastore cluster, or it is empty",
			&types.InvalidArgument{InvalidProperty: "podSelectionSpec.storagePod"})
		return body
	}
	type candidate struct {
		ref  types.ManagedObjectReference
		free int64
	}
	var candidates []candidate
	for _, ref := range children {
		ds, ok := ctx.Map.Get(ref).(*simulator.Datastore)
		if !ok {
			continue
		}
		var free int64
		ctx.WithLock(ds, func() { free = ds.Summary.FreeSpace })
		candidates = append(candidates, candidate{ref: ref, free: free})
	}
	sort.SliceStable(candidates, func(i, j int) bool { return candidates[i].free > candidates[j].free })
	result := types.StoragePlacementResult{}
	for i, c := range candidates {
		ds := c.ref
		result.Recommendations = append(result.Recommendations, types.ClusterRecommendation{
			Key:        fmt.Sprint(i + 1),
			Type:       "V1",
			Time:       time.Now(),
			Rating:     1,
			Reason:     "storagePlacement",
			ReasonText: "Satisfy storage initial placement requests",
			Target:     &podSelf,
			Action: []types.BaseClusterAction{&types.StoragePlacementAction{
				ClusterAction: types.ClusterAction{Type: "StoragePlacementV1"},
				RelocateSpec: types.VirtualMachineRelocateSpec{
					Datastore:    &ds,
					DiskMoveType: "moveAllDiskBackingsAndAllowSharing",
				},
				Destination: ds,
			}},
		})
	}
	body.Res = &types.RecommendDatastoresResponse{Returnval: result}
	return body
}
