package main

// HTTP middleware in front of the simulator's ServeMux: it sees every request (SOAP, the
// /folder datastore file access, vAPI /rest and /api, ...), counts it, logs it, and applies
// per-method delays. The SOAP method and its target are read with a streaming XML tokenizer
// that stops at the target; only ReconfigVM_Task and AnswerVM bodies are decoded in full,
// for the CD-ROM and answer details of the request log.

import (
	"bytes"
	"encoding/xml"
	"html"
	"io"
	"net/http"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

const defaultLogSize = 20000

type counters struct {
	methods    map[string]int
	paths      map[string]int
	http       map[string]int
	logins     int
	restLogins int
	injected   int
}

func newCounters() counters {
	return counters{methods: map[string]int{}, paths: map[string]int{}, http: map[string]int{}}
}

type moref struct {
	Type  string `json:"type"`
	Value string `json:"value"`
}

type logEntry struct {
	Seq          int64         `json:"seq"`
	Time         time.Time     `json:"time"`
	Kind         string        `json:"kind"` // "soap" or "http"
	HTTPMethod   string        `json:"http_method"`
	Path         string        `json:"path"`
	Query        string        `json:"query,omitempty"`
	Method       string        `json:"method,omitempty"`
	Target       *moref        `json:"target,omitempty"`
	Status       int           `json:"status"` // 0 while the request is in flight
	Fault        string        `json:"fault,omitempty"`
	FaultMessage string        `json:"fault_message,omitempty"`
	DurationMS   float64       `json:"duration_ms"`
	CdromDisconn *bool         `json:"cdrom_disconnect,omitempty"`
	CdromKeys    []int32       `json:"cdrom_device_keys,omitempty"`
	Cdrom        []cdromChange `json:"cdrom,omitempty"`
	QuestionID   string        `json:"question_id,omitempty"`
	AnswerChoice string        `json:"answer_choice,omitempty"`
}

// requestLog is a bounded log: the oldest entries go first once it is full.
type requestLog struct {
	entries []*logEntry
	next    int64
	max     int
}

func (l *requestLog) clear() {
	l.entries = nil
	if l.max == 0 {
		l.max = defaultLogSize
	}
}

func (l *requestLog) append(e *logEntry) {
	l.next++
	e.Seq = l.next
	if len(l.entries) >= l.max {
		l.entries = l.entries[1:]
	}
	l.entries = append(l.entries, e)
}

var loginMethods = map[string]bool{
	"Login": true, "LoginByToken": true, "LoginExtensionByCertificate": true,
	"LoginExtensionBySubjectName": true, "LoginBySSPI": true,
}

func (in *Injector) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		segment := firstSegment(r.URL.Path)
		entry := &logEntry{
			Time: start, Kind: "http", HTTPMethod: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery,
		}
		delayKey := r.Method + " " + segment
		if r.Method == http.MethodPost && isSOAP(r) {
			body, err := io.ReadAll(r.Body)
			_ = r.Body.Close()
			r.Body = io.NopCloser(bytes.NewReader(body))
			if err == nil {
				if method, target := soapMethod(body); method != "" {
					entry.Kind = "soap"
					entry.Method = method
					entry.Target = target
					delayKey = method
					in.inspect(entry, body)
				}
			}
		}

		in.mu.Lock()
		in.counts.paths[segment]++
		in.counts.http[r.Method+" "+segment]++
		if entry.Kind == "soap" {
			in.counts.methods[entry.Method]++
		}
		in.log.append(entry)
		delay := in.delays[delayKey]
		in.mu.Unlock()

		if delay > 0 {
			timer := time.NewTimer(delay)
			select {
			case <-timer.C:
			case <-r.Context().Done():
				timer.Stop()
			}
		}

		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		if segment == "/folder" && in.refusesCookie(r) {
			http.Error(rec, "the session is not authenticated", http.StatusUnauthorized)
		} else {
			next.ServeHTTP(rec, r)
		}

		fault, message := "", ""
		if entry.Kind == "soap" && rec.status >= http.StatusInternalServerError {
			fault, message = parseFault(rec.captured.Bytes())
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		entry.Status = rec.status
		entry.DurationMS = float64(time.Since(start).Microseconds()) / 1000
		entry.Fault, entry.FaultMessage = fault, message
		if rec.status == http.StatusOK {
			if entry.Kind == "soap" && loginMethods[entry.Method] {
				in.counts.logins++
			}
			if isVAPILogin(r) {
				in.counts.restLogins++
			}
		}
	})
}

// inspect adds the CD-ROM details of a ReconfigVM_Task and the answer of an AnswerVM.
func (in *Injector) inspect(entry *logEntry, body []byte) {
	if entry.Method != "ReconfigVM_Task" && entry.Method != "AnswerVM" {
		return
	}
	method, err := simulator.UnmarshalBody(vimTypeFunc, body)
	if err != nil {
		return
	}
	switch req := method.Body.(type) {
	case *types.AnswerVM:
		entry.QuestionID = req.QuestionId
		entry.AnswerChoice = req.AnswerChoice
	case *types.ReconfigVM_Task:
		var changes []cdromChange
		if vm, ok := in.registry.Get(req.This).(*simulator.VirtualMachine); ok {
			in.newContext().WithLock(vm, func() {
				if vm.Config != nil {
					changes = cdromChanges(object.VirtualDeviceList(vm.Config.Hardware.Device), &req.Spec)
				}
			})
		}
		disconnects := len(disconnectedKeys(changes)) > 0
		entry.Cdrom = changes
		entry.CdromKeys = disconnectedKeys(changes)
		entry.CdromDisconn = &disconnects
	}
}

var vimTypes = types.TypeFunc()

// vimTypeFunc resolves vim25 type names, also when a client prefixes them with a namespace.
func vimTypeFunc(name string) (reflect.Type, bool) {
	if t, ok := vimTypes(name); ok {
		return t, true
	}
	if _, local, ok := strings.Cut(name, ":"); ok {
		return vimTypes(local)
	}
	return nil, false
}

func isSOAP(r *http.Request) bool {
	return r.Header.Get("SOAPAction") != "" || strings.Contains(r.Header.Get("Content-Type"), "xml")
}

func isVAPILogin(r *http.Request) bool {
	if r.Method != http.MethodPost {
		return false
	}
	q := r.URL.Query()
	if q.Get("~action") != "" || q.Get("action") != "" {
		return false
	}
	return r.URL.Path == "/rest/com/vmware/cis/session" || r.URL.Path == "/api/session"
}

// firstSegment returns "/sdk" for "/sdk/vimService", "/folder" for "/folder/x.iso", "/" for "/".
func firstSegment(path string) string {
	rest := strings.TrimPrefix(path, "/")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[:i]
	}
	return "/" + rest
}

// soapMethod reads the name of the first element inside the SOAP Body and its _this.
func soapMethod(body []byte) (string, *moref) {
	dec := xml.NewDecoder(bytes.NewReader(body))
	inBody := false
	method := ""
	for {
		tok, err := dec.Token()
		if err != nil {
			return method, nil
		}
		start, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		switch {
		case !inBody:
			inBody = start.Name.Local == "Body"
		case method == "":
			method = start.Name.Local
		case start.Name.Local == "_this":
			ref := &moref{}
			for _, a := range start.Attr {
				if a.Name.Local == "type" {
					ref.Type = a.Value
				}
			}
			var value string
			if err := dec.DecodeElement(&value, &start); err != nil {
				return method, nil
			}
			ref.Value = strings.TrimSpace(value)
			return method, ref
		default:
			return method, nil // _this comes first; anything else means there is none
		}
	}
}

var (
	faultTypeRE   = regexp.MustCompile(`xsi:type="(?:[A-Za-z0-9]+:)?([A-Za-z0-9_]+)"`)
	faultStringRE = regexp.MustCompile(`(?s)<faultstring>(.*?)</faultstring>`)
)

// parseFault extracts the fault type and message from a SOAP fault response.
func parseFault(body []byte) (string, string) {
	fault, message := "", ""
	if i := bytes.Index(body, []byte("<detail>")); i >= 0 {
		if m := faultTypeRE.FindSubmatch(body[i:]); m != nil {
			fault = string(m[1])
		}
	}
	if m := faultStringRE.FindSubmatch(body); m != nil {
		message = html.UnescapeString(string(m[1]))
	}
	return fault, message
}

// recorder notes the status of a response and keeps the start of error bodies.
type recorder struct {
	http.ResponseWriter
	status   int
	wrote    bool
	captured bytes.Buffer
}

const captureLimit = 64 << 10

func (r *recorder) WriteHeader(code int) {
	if !r.wrote {
		r.status = code
		r.wrote = true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if r.status >= http.StatusInternalServerError && r.captured.Len() < captureLimit {
		r.captured.Write(p)
	}
	return r.ResponseWriter.Write(p)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
