// Command vcsim-af runs govmomi's vSphere simulator (vcsim) with the inventory agent-forge's
// tests and demo rely on, TLS that clients can verify, and a loopback control API for
// fault injection.
//
// It promises: once the first line of stdout (one JSON object) is printed, the SDK endpoint
// and the control API both answer; SIGINT/SIGTERM (or the parent process going away when
// -exit-with-parent is set) shuts both down and removes the datastore directories it made.
// Everything printed after that first line goes to stderr.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vmware/govmomi/simulator"
	_ "github.com/vmware/govmomi/vapi/simulator" // registers the vAPI (/rest, /api) endpoints: tags, sessions
)

// readyLine is the single JSON document printed on stdout once everything answers.
type readyLine struct {
	URL        string `json:"url"`
	Server     string `json:"server"`
	Username   string `json:"username"`
	Password   string `json:"password"`
	CAFile     string `json:"ca_file"`
	ControlURL string `json:"control_url"`
	Dir        string `json:"dir"`
	PID        int    `json:"pid"`
}

type options struct {
	listen         string
	controlListen  string
	username       string
	password       string
	tlsCert        string
	tlsKey         string
	caFile         string
	dir            string
	exitWithParent bool
	trace          bool
	delays         delayFlag
	taskDelays     delayFlag
	inventory      inventorySpec
}

// delayFlag collects repeated -delay Method=ms flags.
type delayFlag map[string]time.Duration

func (d delayFlag) String() string {
	parts := make([]string, 0, len(d))
	for k, v := range d {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v.Milliseconds()))
	}
	return strings.Join(parts, ",")
}

func (d delayFlag) Set(value string) error {
	for _, item := range strings.Split(value, ",") {
		name, ms, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || name == "" {
			return fmt.Errorf("want Method=milliseconds, got %q", item)
		}
		n, err := strconv.Atoi(ms)
		if err != nil || n < 0 {
			return fmt.Errorf("delay for %s: want a non-negative integer of milliseconds, got %q", name, ms)
		}
		d[name] = time.Duration(n) * time.Millisecond
	}
	return nil
}

func parseFlags(args []string) (*options, error) {
	o := &options{delays: delayFlag{}, taskDelays: delayFlag{}}
	fs := flag.NewFlagSet("vcsim-af", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "SDK listen address (port 0 picks a free port)")
	fs.StringVar(&o.controlListen, "control-listen", "127.0.0.1:0", "control API listen address (plain HTTP, keep it on loopback)")
	fs.StringVar(&o.username, "username", "administrator@vsphere.local", "the one user that may log in")
	fs.StringVar(&o.password, "password", "", "its password (default: random, printed in the ready line)")
	fs.StringVar(&o.tlsCert, "tlscert", "", "PEM certificate for the SDK endpoint (default: generate a CA and a server certificate)")
	fs.StringVar(&o.tlsKey, "tlskey", "", "PEM key for -tlscert")
	fs.StringVar(&o.caFile, "ca-file", "", "where to write the PEM clients should trust (default: <dir>/ca.pem)")
	fs.StringVar(&o.dir, "dir", "", "directory for datastores and the CA file (default: a temporary directory removed on exit)")
	fs.BoolVar(&o.exitWithParent, "exit-with-parent", false, "exit when the parent process goes away")
	fs.BoolVar(&o.trace, "trace", false, "write SOAP traffic to stderr")
	fs.Var(o.delays, "delay", "Method=ms: delay every call of a SOAP method (or \"PUT /folder\"-style HTTP key); repeatable")
	fs.Var(o.taskDelays, "task-delay", "Method_Task=ms: keep the tasks of a task method running that long first; repeatable")
	inv := &o.inventory
	fs.IntVar(&inv.Datacenters, "datacenters", 1, "number of datacenters (dc1, dc2, ...)")
	fs.IntVar(&inv.Clusters, "clusters", 1, "clusters per datacenter (cluster, cluster2, ...)")
	fs.IntVar(&inv.Hosts, "hosts", 2, "hosts per cluster")
	fs.IntVar(&inv.PodDatastores, "datastores", 2, "datastores in the datastore cluster (ds1, ds2, ...)")
	fs.IntVar(&inv.LooseDatastores, "loose-datastores", 0, "extra datastores outside the datastore cluster (local1, local2, ...)")
	fs.StringVar(&inv.PodName, "datastore-cluster", "dsc1", "name of the datastore cluster (StoragePod); empty for none")
	fs.BoolVar(&inv.SDRS, "sdrs", true, "enable Storage DRS on the datastore cluster")
	fs.StringVar(&inv.ISODatastore, "iso-datastore", "iso-ds", "name of the separate ISO datastore; empty for none")
	fs.IntVar(&inv.Portgroups, "portgroups", 1, "standard port groups (\"VM Network\", \"VM Network 2\", ...)")
	fs.IntVar(&inv.DVPortgroups, "dvportgroups", 1, "distributed port groups on switch dvs1 (dvpg1, dvpg2, ...)")
	fs.IntVar(&inv.Folders, "folders", 0, "VM folders under vm/ (folder1, folder2, ...)")
	fs.IntVar(&inv.VMs, "vms", 0, "powered-on VMs to create in the first cluster (vm1, vm2, ...)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return nil, errors.New("-tlscert and -tlskey go together")
	}
	if err := inv.validate(); err != nil {
		return nil, err
	}
	if o.password == "" {
		buf := make([]byte, 12)
		if _, err := rand.Read(buf); err != nil {
			return nil, err
		}
		o.password = hex.EncodeToString(buf)
	}
	return o, nil
}

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("vcsim-af: ")
	log.SetOutput(os.Stderr)

	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		log.Printf("%v", err)
		os.Exit(2)
	}
	if err := run(o); err != nil {
		log.Printf("%v", err)
		os.Exit(1)
	}
}

// newInstanceUUID is a random (version 4) UUID.
func newInstanceUUID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("instance UUID: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), nil
}

func run(o *options) error {
	// The parent is read before anything else: read after the ready line, a parent
	// killed as soon as it saw that line would already be gone, and the changed parent
	// never noticed.
	parent := os.Getppid()
	simulator.Trace = o.trace
	simulator.TraceFile = os.Stderr

	dir, removeDir, err := workDir(o.dir)
	if err != nil {
		return err
	}
	defer removeDir()

	if o.caFile == "" {
		o.caFile = filepath.Join(dir, "ca.pem")
	}
	tlsConfig, err := serverTLS(o.tlsCert, o.tlsKey, o.caFile)
	if err != nil {
		return err
	}

	model := simulator.VPX()
	// Each simulator is its own vCenter with its own instance UUID, as real ones are
	// (the operator's login guard joins the spellings of one vCenter by it); govmomi
	// derives one from the machine's node ID, the same for every simulator here.
	instanceUUID, err := newInstanceUUID()
	if err != nil {
		return err
	}
	model.ServiceContent.About.InstanceUuid = instanceUUID
	model.Datacenter = 0
	model.Cluster = 0
	model.ClusterHost = 0
	model.Host = 0
	model.Datastore = 0
	model.Portgroup = 0
	model.Machine = 0
	model.Autostart = false
	if err := model.Create(); err != nil {
		return fmt.Errorf("create simulator model: %w", err)
	}
	defer model.Remove()

	injector := newInjector(model.Service)
	for name, d := range o.delays {
		injector.setDelay(name, d)
	}
	for name, d := range o.taskDelays {
		if err := injector.setTaskDelay(name, d); err != nil {
			return fmt.Errorf("-task-delay %s: %w", name, err)
		}
	}
	injector.install()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := buildInventory(ctx, model, o.inventory, filepath.Join(dir, "datastores")); err != nil {
		return fmt.Errorf("build inventory: %w", err)
	}

	listen, err := url.Parse("https://" + o.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	listen.User = url.UserPassword(o.username, o.password)
	model.Service.Listen = listen
	model.Service.TLS = tlsConfig
	model.Service.RegisterEndpoints = true

	server := model.Service.NewServer()
	defer closeWithin(server, 3*time.Second)
	// The simulator serves its own ServeMux; put our counting/logging middleware in front.
	// Nobody can have connected yet: the port is announced only by the ready line below.
	server.Config.Handler = injector.middleware(server.Config.Handler)
	if err := injector.attachVAPI(model.Service.ServeMux); err != nil {
		return err
	}

	controlListener, err := net.Listen("tcp", o.controlListen)
	if err != nil {
		return fmt.Errorf("control API listen: %w", err)
	}
	control := &http.Server{Handler: injector.controlAPI(), ReadHeaderTimeout: 10 * time.Second}
	controlErr := make(chan error, 1)
	go func() { controlErr <- control.Serve(controlListener) }()
	defer func() {
		shutdownCtx, stop := context.WithTimeout(context.Background(), 2*time.Second)
		defer stop()
		_ = control.Shutdown(shutdownCtx)
	}()

	sdk := *server.URL
	sdk.User = nil
	sdk.RawQuery = ""
	ready := readyLine{
		URL:        sdk.String(),
		Server:     sdk.Host,
		Username:   o.username,
		Password:   o.password,
		CAFile:     o.caFile,
		ControlURL: "http://" + controlListener.Addr().String(),
		Dir:        dir,
		PID:        os.Getpid(),
	}
	line, err := json.Marshal(ready)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(os.Stdout, "%s\n", line); err != nil {
		return err
	}
	_ = os.Stdout.Sync()
	log.Printf("ready: sdk %s, control %s", ready.URL, ready.ControlURL)

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	parentGone := make(chan struct{})
	if o.exitWithParent {
		go watchParent(ctx, parent, parentGone)
	}
	select {
	case sig := <-signals:
		log.Printf("%s: shutting down", sig)
	case <-parentGone:
		log.Printf("parent process went away: shutting down")
	case err := <-controlErr:
		return fmt.Errorf("control API: %w", err)
	}
	return nil
}

// closeWithin closes the SDK server, waiting at most d for requests in flight (long
// polls such as WaitForUpdatesEx may run for minutes): shutdown must not hang on them.
func closeWithin(server *simulator.Server, d time.Duration) {
	done := make(chan struct{})
	go func() {
		server.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		log.Printf("requests still in flight after %s: not waiting for them", d)
	}
}

// workDir returns the directory to hold datastores, and how to clean it up.
func workDir(dir string) (string, func(), error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", nil, err
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", nil, err
		}
		// A caller-owned directory keeps its CA file; only our datastores go away.
		return abs, func() { _ = os.RemoveAll(filepath.Join(abs, "datastores")) }, nil
	}
	tmp, err := os.MkdirTemp("", "vcsim-af-")
	if err != nil {
		return "", nil, err
	}
	return tmp, func() { _ = os.RemoveAll(tmp) }, nil
}

// watchParent closes gone once this process has been re-parented (parent, its parent at
// start, exited).
func watchParent(ctx context.Context, parent int, gone chan<- struct{}) {
	ticker := time.NewTicker(250 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			if os.Getppid() != parent {
				close(gone)
				return
			}
		}
	}
}
