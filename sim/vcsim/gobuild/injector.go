package main

// The Injector holds every piece of fault-injection state: locked CD-ROM doors and the
// questions VMs are waiting on, scripted task failures, ended sessions, per-method delays,
// and what the middleware counted and logged. One mutex guards it all.
//
// Lock order: a simulator object lock (held by the simulator while it runs a method) may be
// taken before Injector.mu, never after. Code holding mu never waits for an object lock.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

const (
	stageTask = "task"
	stageCall = "call"

	cdromLockedMessageID = "msg.cdromdisconnect.locked"
	cdromLockedText      = "The guest operating system has locked the CD-ROM door and is probably using the CD-ROM, " +
		"which can prevent the guest from recognizing media changes. If possible, eject the CD-ROM from inside " +
		"the guest before disconnecting. Disconnect anyway and override the lock?"
)

type Injector struct {
	service  *simulator.Service
	registry *simulator.Registry

	mu          sync.Mutex
	locked      map[types.ManagedObjectReference]bool
	questions   map[types.ManagedObjectReference][]*question
	questionSeq map[types.ManagedObjectReference]int
	rules       map[string][]*failRule
	delays      map[string]time.Duration
	taskDelays  map[string]time.Duration
	endedAt     time.Time
	endedKeys   map[string]struct{}
	names       map[nameKey]types.ManagedObjectReference // VM names held by creations in flight -> their task (names.go)
	macs        *macAllocator                            // NIC MAC addresses (macs.go); its own mutex
	counts      counters
	log         requestLog

	// clearVAPISessions ends every vAPI (/rest, /api) session; set by attachVAPI.
	clearVAPISessions func() int
}

// question is one entry of a VM's question queue; runtime.question shows the head.
type question struct {
	vm      types.ManagedObjectReference
	info    types.VirtualMachineQuestionInfo
	choices map[string]bool
	pending *pendingReconfig // set for the CD-ROM lock question of a held reconfigure
}

// pendingReconfig is a ReconfigVM_Task held `running` until its lock question is answered.
type pendingReconfig struct {
	task *simulator.Task
	req  *types.ReconfigVM_Task
	keys []int32
}

type failRule struct {
	Method    string `json:"method"`
	Target    string `json:"target,omitempty"`
	Remaining int    `json:"remaining"`
	Fault     string `json:"fault"`
	Stage     string `json:"stage"`
	Message   string `json:"message,omitempty"`
}

func newInjector(service *simulator.Service) *Injector {
	in := &Injector{
		service:           service,
		registry:          service.Context.Map,
		clearVAPISessions: func() int { return 0 },
		names:             map[nameKey]types.ManagedObjectReference{},
		macs:              newMACAllocator(),
	}
	in.resetLocked()
	return in
}

// resetLocked clears faults, delays, door locks, counters and the log; the caller holds
// mu. Pending questions stay: they belong to VMs and running tasks.
func (in *Injector) resetLocked() {
	in.locked = map[types.ManagedObjectReference]bool{}
	if in.questions == nil {
		in.questions = map[types.ManagedObjectReference][]*question{}
		in.questionSeq = map[types.ManagedObjectReference]int{}
	}
	if in.endedKeys == nil {
		in.endedKeys = map[string]struct{}{}
	}
	in.rules = map[string][]*failRule{}
	in.delays = map[string]time.Duration{}
	in.taskDelays = map[string]time.Duration{}
	in.counts = newCounters()
	in.log.clear()
}

func (in *Injector) reset() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.resetLocked()
}

// newContext returns a simulator context for work done outside a SOAP request.
func (in *Injector) newContext() *simulator.Context {
	return &simulator.Context{Context: context.Background(), Map: in.registry}
}

// install puts the SOAP and registry hooks in place on the vim25 registry.
func (in *Injector) install() {
	in.registry.Handler = in.handle
	in.registry.Cookie = in.cookie
	in.registry.AddHandler(&registryHooks{in: in})
}

// attachVAPI finds the vAPI simulator behind /rest so that end_sessions can end its sessions
// too. The handler type is unexported; its exported Session map and embedded mutex are used
// through reflection, and a mismatch fails start-up loudly rather than silently skipping.
func (in *Injector) attachVAPI(mux *http.ServeMux) error {
	h, _ := mux.Handler(&http.Request{Method: http.MethodGet, URL: &url.URL{Path: "/rest/com/vmware/cis/session"}})
	locker, ok := h.(sync.Locker)
	v := reflect.ValueOf(h)
	if !ok || v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("vAPI simulator not found behind /rest (got %T)", h)
	}
	sessions := v.Elem().FieldByName("Session")
	if !sessions.IsValid() || sessions.Kind() != reflect.Map {
		return fmt.Errorf("vAPI simulator %T has no Session map", h)
	}
	in.clearVAPISessions = func() int {
		locker.Lock()
		defer locker.Unlock()
		n := sessions.Len()
		sessions.Clear()
		return n
	}
	return nil
}

// ---- sessions -------------------------------------------------------------------------

var sessionlessMethods = map[string]bool{
	"Login": true, "LoginByToken": true, "LoginExtensionByCertificate": true,
	"LoginExtensionBySubjectName": true, "LoginBySSPI": true, "CloneSession": true,
	"RetrieveServiceContent": true, "RetrieveInternalContent": true,
}

// cookie maps the session cookie to a simulator session, hiding sessions that were ended.
func (in *Injector) cookie(ctx *simulator.Context) string {
	key := simulator.HTTPCookie(ctx)
	in.mu.Lock()
	defer in.mu.Unlock()
	if _, ended := in.endedKeys[key]; ended {
		return ""
	}
	return key
}

// sessionEnded reports whether s is a client session logged in before the last
// end_sessions.
//
// Only sessions made by a login (Login*, CloneSession, ...) carry a LoginTime. The
// simulator's in-process client (Service.RoundTrip) runs on an internal session that never
// logs in: the /folder handler resolves dcPath and dsName through it, and the inventory is
// built through it. end_sessions must leave that one alone, or every /folder request
// answers 404 ("failed to locate datastore") for the rest of the simulator's life.
func (in *Injector) sessionEnded(s *simulator.Session) bool {
	if s.LoginTime.IsZero() {
		return false
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.endedLocked(s.Key, s.LoginTime)
}

// endedLocked reports whether the client session key, logged in at loginTime, was ended,
// and remembers the answer; the caller holds mu.
func (in *Injector) endedLocked(key string, loginTime time.Time) bool {
	if _, ok := in.endedKeys[key]; ok {
		return true
	}
	if !in.endedAt.IsZero() && !loginTime.After(in.endedAt) {
		in.endedKeys[key] = struct{}{}
		return true
	}
	return false
}

// refusesCookie reports whether r carries a SOAP session cookie that names no live client
// session: one ended by end_sessions, logged out, expired or never issued. vCenter answers
// such a /folder request with 401; the simulator's /folder handler checks no session at
// all. A request without the cookie is left to the simulator, as before.
func (in *Injector) refusesCookie(r *http.Request) bool {
	c, err := r.Cookie(soap.SessionCookieName)
	if err != nil || c.Value == "" {
		return false
	}
	in.mu.Lock()
	_, ended := in.endedKeys[c.Value]
	in.mu.Unlock()
	if ended {
		return true
	}
	s, ok := in.clientSession(c.Value)
	if !ok {
		return true
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.endedLocked(s.Key, s.LoginTime)
}

// clientSession looks a client session up by key in the simulator's SessionManager. Its
// session map is unexported; the per-session view of the SessionManager (what a client
// reading sessionList sees) lists it.
func (in *Injector) clientSession(key string) (types.UserSession, bool) {
	view := &simulator.Session{Registry: simulator.NewRegistry(), Map: in.registry}
	sm, ok := view.Get(in.registry.SessionManager().Reference()).(*simulator.SessionManager)
	if !ok {
		return types.UserSession{}, false
	}
	for _, s := range sm.SessionList {
		if s.Key == key {
			return s, true
		}
	}
	return types.UserSession{}, false
}

func (in *Injector) endSessions() (time.Time, int) {
	in.mu.Lock()
	in.endedAt = time.Now()
	at := in.endedAt
	in.mu.Unlock()
	return at, in.clearVAPISessions()
}

// ---- delays ----------------------------------------------------------------------------

func (in *Injector) setDelay(key string, d time.Duration) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if d <= 0 {
		delete(in.delays, key)
		return
	}
	in.delays[key] = d
}

// setTaskDelay keeps the tasks of a task method running for d before the method runs.
func (in *Injector) setTaskDelay(method string, d time.Duration) error {
	if !taskMethods[method] {
		return fmt.Errorf("task delays are supported for %s", strings.Join(sortedKeys(taskMethods), ", "))
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if d <= 0 {
		delete(in.taskDelays, method)
		return nil
	}
	in.taskDelays[method] = d
	return nil
}

func (in *Injector) taskDelayFor(method string) time.Duration {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.taskDelays[method]
}

// ---- scripted failures ----------------------------------------------------------------

func (in *Injector) addRule(r failRule) error {
	if r.Method == "" {
		return errors.New("method is required")
	}
	if r.Remaining < 1 {
		return errors.New("count must be at least 1")
	}
	if _, ok := faultMakers[r.Fault]; !ok {
		return fmt.Errorf("unknown fault %q; known: %s", r.Fault, strings.Join(faultNames(), ", "))
	}
	if r.Stage == "" {
		r.Stage = stageCall
		if taskMethods[r.Method] {
			r.Stage = stageTask
		}
	}
	switch r.Stage {
	case stageCall:
	case stageTask:
		if !taskMethods[r.Method] {
			return fmt.Errorf("stage %q is supported for %s; use stage %q for %s",
				stageTask, strings.Join(sortedKeys(taskMethods), ", "), stageCall, r.Method)
		}
	default:
		return fmt.Errorf("stage must be %q or %q", stageTask, stageCall)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	in.rules[r.Method] = append(in.rules[r.Method], &r)
	return nil
}

// takeRule consumes one use of the first rule matching m.
func (in *Injector) takeRule(m *simulator.Method) *failRule {
	in.mu.Lock()
	defer in.mu.Unlock()
	rules := in.rules[m.Name]
	for i, r := range rules {
		if r.Target != "" && r.Target != m.This.Value {
			continue
		}
		taken := *r
		r.Remaining--
		if r.Remaining == 0 {
			in.rules[m.Name] = append(rules[:i:i], rules[i+1:]...)
		}
		in.counts.injected++
		return &taken
	}
	return nil
}

func (in *Injector) listRules() []failRule {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := []failRule{}
	for _, name := range sortedKeys(in.rules) {
		for _, r := range in.rules[name] {
			out = append(out, *r)
		}
	}
	return out
}

func (in *Injector) clearRules() {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.rules = map[string][]*failRule{}
}

// ---- CD-ROM door locks and questions -----------------------------------------------------

// findVM resolves a VM by name, BIOS UUID (config.uuid) or moref value.
func (in *Injector) findVM(selector string) (*simulator.VirtualMachine, error) {
	if selector == "" {
		return nil, errors.New("vm is required (name, BIOS UUID or moref)")
	}
	ctx := in.newContext()
	var found []*simulator.VirtualMachine
	for _, e := range in.registry.All("VirtualMachine") {
		vm, ok := e.(*simulator.VirtualMachine)
		if !ok {
			continue
		}
		match := false
		ctx.WithLock(vm, func() {
			match = vm.Self.Value == selector || vm.Name == selector ||
				(vm.Config != nil && strings.EqualFold(vm.Config.Uuid, selector))
		})
		if match {
			found = append(found, vm)
		}
	}
	switch len(found) {
	case 0:
		return nil, errNotFound{fmt.Sprintf("no VM named %q or with BIOS UUID %q", selector, selector)}
	case 1:
		return found[0], nil
	default:
		return nil, fmt.Errorf("%d VMs match %q; use the BIOS UUID or moref", len(found), selector)
	}
}

type errNotFound struct{ msg string }

func (e errNotFound) Error() string { return e.msg }

type errConflict struct{ msg string }

func (e errConflict) Error() string { return e.msg }

// lockDoor makes the guest of vm hold its CD-ROM door locked.
func (in *Injector) lockDoor(vm *simulator.VirtualMachine, lock bool) error {
	ctx := in.newContext()
	var err error
	ctx.WithLock(vm, func() {
		if lock && vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
			err = errConflict{fmt.Sprintf("VM %s is %s: only a running guest can lock its CD-ROM door",
				vm.Name, vm.Runtime.PowerState)}
			return
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		if lock {
			in.locked[vm.Self] = true
		} else {
			delete(in.locked, vm.Self)
		}
	})
	return err
}

// doorLocked reports whether vm's guest holds the door locked; the caller holds vm's lock.
// A guest that is not running holds no lock, so a powered-off VM forgets it.
func (in *Injector) doorLocked(vm *simulator.VirtualMachine) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
		delete(in.locked, vm.Self)
		return false
	}
	return in.locked[vm.Self]
}

func (in *Injector) pendingOf(vm types.ManagedObjectReference) *pendingReconfig {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, q := range in.questions[vm] {
		if q.pending != nil {
			return q.pending
		}
	}
	return nil
}

type choice struct {
	Key     string `json:"key"`
	Label   string `json:"label"`
	Summary string `json:"summary,omitempty"`
}

func newQuestion(messageID, text string, choices []choice, defaultKey string) (*question, error) {
	if messageID == "" {
		return nil, errors.New("message_id is required")
	}
	if len(choices) == 0 {
		choices = []choice{{Key: "0", Label: "OK"}}
	}
	if defaultKey == "" {
		defaultKey = choices[0].Key
	}
	q := &question{choices: map[string]bool{}}
	q.info.Text = text
	q.info.Message = []types.VirtualMachineMessage{{Id: messageID, Text: text}}
	q.info.Choice.DefaultIndex = -1
	for i, c := range choices {
		if c.Key == "" || q.choices[c.Key] {
			return nil, fmt.Errorf("choice keys must be unique and non-empty (got %q)", c.Key)
		}
		q.choices[c.Key] = true
		summary := c.Summary
		if summary == "" {
			summary = c.Label
		}
		q.info.Choice.ChoiceInfo = append(q.info.Choice.ChoiceInfo, &types.ElementDescription{
			Description: types.Description{Label: c.Label, Summary: summary},
			Key:         c.Key,
		})
		if c.Key == defaultKey {
			q.info.Choice.DefaultIndex = int32(i)
		}
	}
	if q.info.Choice.DefaultIndex < 0 {
		return nil, fmt.Errorf("default %q is not one of the choices", defaultKey)
	}
	return q, nil
}

func cdromLockedQuestion() *question {
	q, err := newQuestion(cdromLockedMessageID, cdromLockedText,
		[]choice{{Key: "0", Label: "Yes"}, {Key: "1", Label: "No"}}, "1")
	if err != nil {
		panic(err) // constant input
	}
	return q
}

// enqueueQuestion gives q its id and queues it on vm; the caller holds vm's lock (via ctx).
func (in *Injector) enqueueQuestion(ctx *simulator.Context, vm *simulator.VirtualMachine, q *question) string {
	in.mu.Lock()
	in.questionSeq[vm.Self]++
	q.vm = vm.Self
	q.info.Id = fmt.Sprintf("_vmx%d", in.questionSeq[vm.Self])
	in.questions[vm.Self] = append(in.questions[vm.Self], q)
	head := len(in.questions[vm.Self]) == 1
	in.mu.Unlock()
	if head {
		info := q.info
		ctx.Update(vm, []types.PropertyChange{{Name: "runtime.question", Val: &info}})
	}
	return q.info.Id
}

// answer pops the head question of vm if id and choice fit it, and returns it with the
// question that now heads the queue (nil when none).
func (in *Injector) answer(vm types.ManagedObjectReference, id, choice string) (*question, *question, types.BaseMethodFault, string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	queue := in.questions[vm]
	if len(queue) == 0 {
		return nil, nil, &types.InvalidArgument{InvalidProperty: "questionId"},
			fmt.Sprintf("virtual machine %s has no pending question", vm.Value)
	}
	head := queue[0]
	if head.info.Id != id {
		return nil, nil, &types.InvalidArgument{InvalidProperty: "questionId"},
			fmt.Sprintf("question %q is not pending on %s", id, vm.Value)
	}
	if !head.choices[choice] {
		return nil, nil, &types.InvalidArgument{InvalidProperty: "answerChoice"},
			fmt.Sprintf("%q is not a choice of question %s", choice, id)
	}
	queue = queue[1:]
	if len(queue) == 0 {
		delete(in.questions, vm)
		return head, nil, nil, ""
	}
	in.questions[vm] = queue
	return head, queue[0], nil, ""
}

type questionView struct {
	VM          string   `json:"vm"`
	ID          string   `json:"id"`
	MessageID   string   `json:"message_id"`
	Text        string   `json:"text"`
	Choices     []string `json:"choices"`
	PendingTask string   `json:"pending_task,omitempty"`
	DeviceKeys  []int32  `json:"cdrom_device_keys,omitempty"`
	Shown       bool     `json:"shown"`
}

func (in *Injector) listQuestions() []questionView {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := []questionView{}
	for _, vm := range sortedRefs(in.questions) {
		for i, q := range in.questions[vm] {
			v := questionView{VM: vm.Value, ID: q.info.Id, Text: q.info.Text, Shown: i == 0}
			if len(q.info.Message) > 0 {
				v.MessageID = q.info.Message[0].Id
			}
			for _, c := range q.info.Choice.ChoiceInfo {
				v.Choices = append(v.Choices, c.GetElementDescription().Key)
			}
			if q.pending != nil {
				v.PendingTask = q.pending.task.Self.Value
				v.DeviceKeys = q.pending.keys
			}
			out = append(out, v)
		}
	}
	return out
}
