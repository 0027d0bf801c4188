package main

// The control API: plain HTTP with JSON bodies on its own loopback port, documented in
// sim/vcsim/README.md. Errors come back as {"error": "..."} with 400 (bad request),
// 404 (no such VM) or 409 (the simulator's state does not allow it).

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

func (in *Injector) controlAPI() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})
	mux.HandleFunc("POST /reset", func(w http.ResponseWriter, _ *http.Request) {
		in.reset()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})

	mux.HandleFunc("POST /cdrom/lock", in.handleDoor(true))
	mux.HandleFunc("POST /cdrom/unlock", in.handleDoor(false))
	mux.HandleFunc("GET /cdrom/locks", func(w http.ResponseWriter, _ *http.Request) {
		in.mu.Lock()
		locks := []string{}
		for ref := range in.locked {
			locks = append(locks, ref.Value)
		}
		in.mu.Unlock()
		sort.Strings(locks)
		writeJSON(w, http.StatusOK, map[string]any{"locked": locks})
	})

	mux.HandleFunc("POST /questions", in.handleRaiseQuestion)
	mux.HandleFunc("GET /questions", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"questions": in.listQuestions()})
	})

	mux.HandleFunc("POST /faults", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Method  string `json:"method"`
			Count   int    `json:"count"`
			Fault   string `json:"fault"`
			Stage   string `json:"stage"`
			Message string `json:"message"`
			Target  string `json:"target"`
		}
		if !readJSON(w, r, &req) {
			return
		}
		if req.Count == 0 {
			req.Count = 1
		}
		rule := failRule{Method: req.Method, Target: req.Target, Remaining: req.Count, Fault: req.Fault,
			Stage: req.Stage, Message: req.Message}
		if err := in.addRule(rule); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"rules": in.listRules()})
	})
	mux.HandleFunc("GET /faults", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{
			"rules": in.listRules(), "faults": faultNames(), "task_methods": sortedKeys(taskMethods),
		})
	})
	mux.HandleFunc("DELETE /faults", func(w http.ResponseWriter, _ *http.Request) {
		in.clearRules()
		writeJSON(w, http.StatusOK, map[string]any{"rules": []failRule{}})
	})

	mux.HandleFunc("POST /sessions/end", func(w http.ResponseWriter, _ *http.Request) {
		at, rest := in.endSessions()
		writeJSON(w, http.StatusOK, map[string]any{"ended_at": at.UTC(), "rest_sessions": rest})
	})

	mux.HandleFunc("GET /counters", func(w http.ResponseWriter, _ *http.Request) {
		in.mu.Lock()
		c := in.counts
		body := map[string]any{
			"methods": copyMap(c.methods), "paths": copyMap(c.paths), "http": copyMap(c.http),
			"logins": c.logins, "rest_logins": c.restLogins, "faults_injected": c.injected,
		}
		in.mu.Unlock()
		writeJSON(w, http.StatusOK, body)
	})
	mux.HandleFunc("POST /counters/reset", func(w http.ResponseWriter, _ *http.Request) {
		in.mu.Lock()
		in.counts = newCounters()
		in.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})

	mux.HandleFunc("GET /log", in.handleLog)
	mux.HandleFunc("DELETE /log", func(w http.ResponseWriter, _ *http.Request) {
		in.mu.Lock()
		in.log.clear()
		in.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]any{"ok": true})
	})

	mux.HandleFunc("POST /delays", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Method string `json:"method"`
			MS     int    `json:"ms"`
			Stage  string `json:"stage"`
		}
		if !readJSON(w, r, &req) {
			return
		}
		if req.Method == "" || req.MS < 0 {
			writeError(w, http.StatusBadRequest, errors.New("want {\"method\": name, \"ms\": non-negative}"))
			return
		}
		d := time.Duration(req.MS) * time.Millisecond
		switch req.Stage {
		case "", stageCall:
			in.setDelay(req.Method, d)
		case stageTask:
			if err := in.setTaskDelay(req.Method, d); err != nil {
				writeError(w, http.StatusBadRequest, err)
				return
			}
		default:
			writeError(w, http.StatusBadRequest, fmt.Errorf("stage must be %q or %q", stageCall, stageTask))
			return
		}
		writeJSON(w, http.StatusOK, in.listDelays())
	})
	mux.HandleFunc("GET /delays", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, in.listDelays())
	})
	mux.HandleFunc("DELETE /delays", func(w http.ResponseWriter, _ *http.Request) {
		in.mu.Lock()
		in.delays = map[string]time.Duration{}
		in.taskDelays = map[string]time.Duration{}
		in.mu.Unlock()
		writeJSON(w, http.StatusOK, in.listDelays())
	})
	return mux
}

// listDelays returns {"delays": {key: ms}, "task_delays": {method: ms}}.
func (in *Injector) listDelays() map[string]map[string]int64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	ms := func(m map[string]time.Duration) map[string]int64 {
		out := make(map[string]int64, len(m))
		for k, d := range m {
			out[k] = d.Milliseconds()
		}
		return out
	}
	return map[string]map[string]int64{"delays": ms(in.delays), "task_delays": ms(in.taskDelays)}
}

type vmView struct {
	Moref string `json:"moref"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
}

func (in *Injector) view(vm *simulator.VirtualMachine) vmView {
	var v vmView
	in.newContext().WithLock(vm, func() {
		v = vmView{Moref: vm.Self.Value, Name: vm.Name}
		if vm.Config != nil {
			v.UUID = vm.Config.Uuid
		}
	})
	return v
}

func (in *Injector) handleDoor(lock bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			VM string `json:"vm"`
		}
		if !readJSON(w, r, &req) {
			return
		}
		vm, err := in.findVM(req.VM)
		if err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		if err := in.lockDoor(vm, lock); err != nil {
			writeError(w, statusOf(err), err)
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"vm": in.view(vm), "locked": lock})
	}
}

func (in *Injector) handleRaiseQuestion(w http.ResponseWriter, r *http.Request) {
	var req struct {
		VM        string   `json:"vm"`
		MessageID string   `json:"message_id"`
		Text      string   `json:"text"`
		Choices   []choice `json:"choices"`
		Default   string   `json:"default"`
	}
	if !readJSON(w, r, &req) {
		return
	}
	vm, err := in.findVM(req.VM)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	q, err := newQuestion(req.MessageID, req.Text, req.Choices, req.Default)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	ctx := in.newContext()
	var id string
	ctx.WithLock(vm, func() { id = in.enqueueQuestion(ctx, vm, q) })
	writeJSON(w, http.StatusOK, map[string]any{"vm": in.view(vm), "question_id": id})
}

func (in *Injector) handleLog(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since int64
	if s := q.Get("since"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("since: %w", err))
			return
		}
		since = n
	}
	limit := -1
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Errorf("limit: want a non-negative integer, got %q", s))
			return
		}
		limit = n
	}
	method, kind := q.Get("method"), q.Get("kind")
	in.mu.Lock()
	entries := []logEntry{}
	for _, e := range in.log.entries {
		if e.Seq <= since || (method != "" && e.Method != method) || (kind != "" && e.Kind != kind) {
			continue
		}
		copied := *e
		entries = append(entries, copied)
	}
	last := in.log.next
	in.mu.Unlock()
	if limit >= 0 && len(entries) > limit {
		entries = entries[len(entries)-limit:] // the newest `limit` entries
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": entries, "last_seq": last})
}

func statusOf(err error) int {
	var nf errNotFound
	var conflict errConflict
	switch {
	case errors.As(err, &nf):
		return http.StatusNotFound
	case errors.As(err, &conflict):
		return http.StatusConflict
	default:
		return http.StatusBadRequest
	}
}

func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, err error) {
	writeJSON(w, status, map[string]string{"error": err.Error()})
}

func copyMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func sortedRefs[V any](m map[types.ManagedObjectReference]V) []types.ManagedObjectReference {
	refs := make([]types.ManagedObjectReference, 0, len(m))
	for ref := range m {
		refs = append(refs, ref)
	}
	sort.Slice(refs, func(i, j int) bool { return refs[i].Value < refs[j].Value })
	return refs
}
