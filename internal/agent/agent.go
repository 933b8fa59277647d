// Package agent is the server that runs inside every sandbox as PID 1: it
// answers the HTTP API of internal/agentproto (exec, files) on the streams of
// the host's yamux session. Only cmd/pandastack-agent and this package's
// tests import it; the host side lives in internal/sandbox.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Config is what all sessions of one agent process share.
type Config struct {
	Version  string       // the agent's version, reported by hello
	BootedAt time.Time    // when the agent started, reported by hello
	Home     string       // the sandbox user's home; "" means agentproto.UserHome
	Reaper   *Reaper      // nil: wait for each child by pid (when not PID 1)
	Contexts *Contexts    // code contexts, shared by all sessions; nil: a new empty set
	Log      *slog.Logger // nil discards

	// Processes are the background processes, shared by all sessions;
	// nil: a new empty set.
	Processes *Processes

	// ResolvConf and CAMarker are the files a hello's setup writes and
	// reads; "" means /etc/resolv.conf and agentproto.CAMarkerPath.
	ResolvConf, CAMarker string

	// Hosts and Hostname are the files every hello points at the
	// sandbox's name (writeNameFiles); "" leaves that file alone. The
	// agent in a sandbox sets them to /etc/hosts and /etc/hostname.
	Hosts, Hostname string
	// Names is the hellos' writing of those files, shared by all
	// sessions, which wait for it; nil: a new one.
	Names *NameFiles
	// Disk is the directory whose filesystem GET /v1/disk reports; ""
	// means /.
	Disk string
}

// Server answers the agent API for one host session.
type Server struct {
	cfg   Config
	epoch uint32
	home  string
	log   *slog.Logger
	conn  io.ReadWriteCloser // the session's stream from agentproto.Serve; nil when served otherwise
	// watches counts the directory watches open (watch.go).
	watches atomic.Int32
	// uploads are the temp files of uploads, for watches to leave out.
	uploads uploadTemps
}

// NewServer returns the API of the session of the given epoch.
func NewServer(cfg Config, epoch uint32) *Server {
	if cfg.Home == "" {
		cfg.Home = agentproto.UserHome
	}
	if cfg.Log == nil {
		cfg.Log = discardLogger()
	}
	if cfg.Contexts == nil {
		cfg.Contexts = NewContexts()
	}
	if cfg.Processes == nil {
		cfg.Processes = NewProcesses()
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = "/etc/resolv.conf"
	}
	if cfg.CAMarker == "" {
		cfg.CAMarker = agentproto.CAMarkerPath
	}
	if cfg.Names == nil {
		cfg.Names = &NameFiles{}
	}
	if cfg.Disk == "" {
		cfg.Disk = "/"
	}
	return &Server{cfg: cfg, epoch: epoch, home: cfg.Home, log: cfg.Log.With("epoch", epoch)}
}

// Handler routes the agent API.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/hello", s.api(s.hello))
	mux.HandleFunc("POST /v1/exec", s.afterNames(s.api(s.exec)))
	mux.HandleFunc("POST /v1/env", s.api(s.setEnv))
	mux.HandleFunc("GET /v1/disk", s.api(s.disk))
	mux.HandleFunc("GET /v1/pty", s.afterNames(s.api(s.pty)))
	mux.HandleFunc("PUT /v1/files", s.afterNames(s.api(s.putFile)))
	mux.HandleFunc("GET /v1/files", s.afterNames(s.api(s.getFile)))
	mux.HandleFunc("DELETE /v1/files", s.afterNames(s.api(s.deleteFile)))
	mux.HandleFunc("GET /v1/files/list", s.afterNames(s.api(s.listFiles)))
	mux.HandleFunc("GET /v1/files/stat", s.afterNames(s.api(s.statFile)))
	mux.HandleFunc("POST /v1/files/mkdir", s.afterNames(s.api(s.mkdir)))
	mux.HandleFunc("POST /v1/files/rename", s.afterNames(s.api(s.renameFile)))
	mux.HandleFunc("GET /v1/files/watch", s.afterNames(s.api(s.watchFiles)))
	mux.HandleFunc("POST /v1/contexts", s.afterNames(s.api(s.createContext)))
	mux.HandleFunc("GET /v1/contexts", s.api(s.listContexts))
	mux.HandleFunc("POST /v1/contexts/spares", s.api(s.prepareSpares))
	mux.HandleFunc("GET /v1/contexts/spares", s.api(s.listSpares))
	mux.HandleFunc("POST /v1/contexts/spares/touch", s.api(s.touchSpares))
	mux.HandleFunc("POST /v1/contexts/spares/release", s.api(s.releaseSpares))
	mux.HandleFunc("POST /v1/contexts/spares/refill", s.api(s.refillSpares))
	mux.HandleFunc("POST /v1/contexts/spares/hold", s.api(s.holdSpares))
	mux.HandleFunc("DELETE /v1/contexts/spares/hold", s.api(s.unholdSpares))
	mux.HandleFunc("DELETE /v1/contexts/{id}", s.api(s.deleteContext))
	mux.HandleFunc("POST /v1/contexts/{id}/interrupt", s.api(s.interruptContext))
	mux.HandleFunc("POST /v1/contexts/{id}/restart", s.afterNames(s.api(s.restartContext)))
	mux.HandleFunc("POST /v1/contexts/{id}/run", s.afterNames(s.api(s.runCode)))
	mux.HandleFunc("POST /v1/processes", s.afterNames(s.api(s.startProcess)))
	mux.HandleFunc("GET /v1/processes", s.api(s.listProcesses))
	mux.HandleFunc("GET /v1/processes/{pid}/output", s.api(s.processOutput))
	mux.HandleFunc("POST /v1/processes/{pid}/stdin", s.api(s.processStdin))
	mux.HandleFunc("POST /v1/processes/{pid}/kill", s.api(s.killProcess))
	mux.HandleFunc("POST /v1/processes/kill", s.api(s.killAll))
	mux.HandleFunc("/", s.api(func(w http.ResponseWriter, r *http.Request) error {
		// The host reads this beginning (noEndpoint in internal/sandbox)
		// as an agent of an older build.
		return pandastack.Errorf(pandastack.ENotFound, "the agent has no endpoint %s %s; see internal/agentproto/api.go for its API", r.Method, r.URL.Path)
	}))
	return mux
}

// ServeSession serves the API on conn, the byte stream of one epoch handed
// out by agentproto.Serve. It returns when the session ends (the host left,
// or a newer epoch replaced it), after closing all of its streams; that
// cancels the session's requests, which kills their commands.
func ServeSession(cfg Config, epoch uint32, conn io.ReadWriteCloser) error {
	sess, err := yamux.Server(conn, agentproto.MuxConfig())
	if err != nil {
		conn.Close()
		return fmt.Errorf("session %d: %w", epoch, err)
	}
	s := NewServer(cfg, epoch)
	s.conn = conn
	srv := &http.Server{
		Handler:  s.Handler(),
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	s.log.Info("session started")
	err = srv.Serve(sess)
	srv.Close()
	sess.Close()
	s.log.Info("session ended", "reason", err)
	return err
}

func (s *Server) hello(w http.ResponseWriter, r *http.Request) error {
	// A sandbox restored from a snapshot or a fork learns its new id here;
	// processes started from now on see it.
	id := r.URL.Query().Get("sandbox_id")
	if id != "" {
		os.Setenv("PANDASTACK_SANDBOX_ID", id)
		// And its name: the container it was restored into may have had
		// another id (hostname.go).
		if setsHostname() {
			if err := hostOps.ensure(id); err != nil {
				s.log.Warn("naming the sandbox", "err", err)
			}
		}
	}
	// Restored from an image other sandboxes restore too: without the
	// reseed, their kernels would all draw the same "random" numbers. The
	// spares learn the id now, before a hand-out: a pool's sandbox says
	// hello long before its first context is made.
	s.cfg.Contexts.Restored(id, r.URL.Query().Get("reseed") == "1")
	// A host that reads frames of up to 1 MiB gets them: streamed output
	// then crosses stdout in fewer, larger writes.
	if r.URL.Query().Get("large_frames") == "1" {
		agentproto.AllowLargeFrames(s.conn)
	}
	// Resumed after an idle suspend, or a fork's child: start the spares
	// again; or, for a host that paces the refills of its sandboxes
	// (hold_spares=1), once it ends the hold it leaves (hold.go).
	if r.URL.Query().Get("hold_spares") == "1" {
		s.cfg.Contexts.spares.unreleaseHeld()
	} else {
		s.cfg.Contexts.spares.unrelease()
	}
	// A restore gives the sandbox a name of its own (its image was
	// another's): every session starts with the files that say it. In the
	// background: a restored sandbox's first file access costs 6-17 ms,
	// which the create's answer need not wait for; what runs the user's
	// code or touches files waits instead (afterNames).
	// Begun now, so that nothing can slip past the wait; started once the
	// answer is out, so that its file system calls do not hold the answer
	// up in a sandbox of one CPU.
	var names func()
	if s.cfg.Hosts != "" || s.cfg.Hostname != "" {
		log := s.log
		names = s.cfg.Names.begin(func() {
			if err := writeNameFiles(s.cfg.Hosts, s.cfg.Hostname); err != nil {
				log.Warn("writing the sandbox's name files", "err", err)
			}
		})
		defer names()
	}
	h := agentproto.Hello{
		ProtocolVersion: agentproto.ProtocolVersion,
		AgentVersion:    s.cfg.Version,
		Epoch:           s.epoch,
		BootedAt:        s.cfg.BootedAt,
		Contexts:        s.cfg.Contexts.readyIDs(),
		Features:        []string{agentproto.FeatureRunCreates, agentproto.FeatureDisk, agentproto.FeatureKillAll, agentproto.FeatureWatch},
	}
	if setsHostname() {
		h.Features = append(h.Features, agentproto.FeatureHostname)
	}
	// The host's setup of a sandbox after a boot or restore, in the same
	// round trip: its resolver, and whether its trust store has the host's
	// certificates already.
	if ns := r.URL.Query().Get("resolver"); ns != "" {
		if err := writeResolver(s.cfg.ResolvConf, ns); err != nil {
			return err
		}
		h.Resolver = ns
	}
	if r.URL.Query().Get("ca_marker") == "1" {
		m := readMarker(s.cfg.CAMarker)
		h.CAMarker = &m
	}
	writeJSON(w, http.StatusOK, h)
	if f, ok := w.(http.Flusher); ok {
		f.Flush() // the answer out before the name files begin (deferred)
	}
	return nil
}

// writeResolver points the sandbox's resolver at nameserver: path (its
// /etc/resolv.conf) is replaced by a new file renamed into place, so a
// symlink there (a template's systemd-resolved stub) is replaced rather
// than written through.
func writeResolver(path, nameserver string) error {
	addr, err := netip.ParseAddr(nameserver)
	if err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "resolver %q is not an IP address", nameserver)
	}
	want := agentproto.ResolvConf(addr.String())
	if fi, err := os.Lstat(path); err == nil && fi.Mode().IsRegular() {
		if have, err := os.ReadFile(path); err == nil && string(have) == want {
			return nil // as it is (a resume into the same slot)
		}
	}
	return replaceFile(path, want)
}

// NameFiles is the latest hello's write of the name files; its zero
// value is ready.
type NameFiles struct {
	mu   sync.Mutex
	done chan struct{} // closed when the write ended; nil: none yet
}

// begin makes waiters wait for write, and returns what starts it: in the
// background, after the write before it (one a checkpoint caught
// half-way, resumed in a restored image, must not end after this one).
func (n *NameFiles) begin(write func()) (start func()) {
	ch := make(chan struct{})
	n.mu.Lock()
	prev := n.done
	n.done = ch
	n.mu.Unlock()
	return func() {
		go func() {
			defer close(ch)
			if prev != nil {
				<-prev
			}
			write()
		}()
	}
}

func (n *NameFiles) wait(ctx context.Context) {
	n.mu.Lock()
	ch := n.done
	n.mu.Unlock()
	if ch == nil {
		return
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// afterNames runs h once the name files are written: the first command
// or cell of a new sandbox finds localhost and its name resolving.
func (s *Server) afterNames(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.cfg.Names.wait(r.Context())
		h(w, r)
	}
}

// hostsMarker begins the /etc/hosts the agent writes, and hostsEnd ends
// its block of it: what follows is the user's and stays. A file that does
// not begin so is the template's own, which stays whole.
const (
	hostsMarker = "# pandastack: this sandbox's names\n"
	hostsEnd    = "# pandastack: end of this sandbox's names; add your own lines below\n"
)

// hostsFile is the /etc/hosts of a sandbox called name: localhost and
// its own name on the loopback, as Debian does (a template's root file
// system has none: debootstrap makes no /etc/hosts, and without one
// "localhost" went to the resolver and failed).
func hostsFile(name string) string {
	return hostsMarker +
		"127.0.0.1\tlocalhost\n" +
		"::1\tlocalhost ip6-localhost ip6-loopback\n" +
		"127.0.1.1\t" + name + "\n" +
		hostsEnd
}

// newHosts is what the agent's /etc/hosts becomes for a sandbox called
// name, given what it holds now (old; "" when missing): its block
// rewritten, the lines after it kept. ok is false for a template's own.
func newHosts(old, name string) (string, bool) {
	if old == "" {
		return hostsFile(name), true
	}
	if !strings.HasPrefix(old, hostsMarker) {
		return "", false
	}
	rest := ""
	if _, after, found := strings.Cut(old, hostsEnd); found {
		rest = after
	}
	return hostsFile(name) + rest, true
}

// writeNameFiles makes the sandbox's names resolve: hosts (its
// /etc/hosts) gets hostsFile unless the template brought one of its own,
// and hostname (its /etc/hostname, the build host's name in a template)
// gets the sandbox's. A file that already says so is not written again.
// An empty path is left alone.
func writeNameFiles(hosts, hostname string) error {
	name, err := os.Hostname()
	if err != nil || name == "" {
		return fmt.Errorf("hostname: %w", err)
	}
	var errs []error
	if hosts != "" {
		b, err := os.ReadFile(hosts)
		if errors.Is(err, fs.ErrNotExist) {
			b, err = nil, nil
		}
		if want, ours := newHosts(string(b), name); err == nil && ours && want != string(b) {
			errs = append(errs, replaceFile(hosts, want))
		}
	}
	if hostname != "" {
		if b, err := os.ReadFile(hostname); err != nil || string(b) != name+"\n" {
			errs = append(errs, replaceFile(hostname, name+"\n"))
		}
	}
	return errors.Join(errs...)
}

// replaceFile writes content to a new file renamed over path (mode 0644),
// so a symlink there is replaced rather than written through, and no
// reader sees half of it.
func replaceFile(path, content string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".new-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = tmp.WriteString(content)
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// readMarker returns what the small file at path holds, trimmed; "" when
// it cannot be read.
func readMarker(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 256))
	return strings.TrimSpace(string(b))
}

// api adapts a handler that returns an error before writing anything.
func (s *Server) api(f func(http.ResponseWriter, *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := f(w, r); err != nil {
			code, msg := pandastack.ErrorCode(err), pandastack.ErrorMessage(err)
			if code == pandastack.EInternal {
				// Inside the sandbox the details are the user's own.
				msg = err.Error()
				s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			}
			var body agentproto.ErrorBody
			body.Error.Code = code
			body.Error.Message = msg
			writeJSON(w, pandastack.HTTPStatus(code), body)
		}
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

// Process is a process started by a Reaper.
type Process struct {
	Pid  int
	Done <-chan ExitStatus // yields the exit status once
	// Mark is the process's only supplementary group, a gid that no
	// other tree has (0: none; only an agent that is root gives one).
	// Whatever it starts inherits it and cannot drop it: KillTree finds
	// by it what left the tree (setsid and a double fork, an exited
	// shell's jobs).
	Mark uint32
}

// ExitStatus is how a process ended.
type ExitStatus struct {
	Code   int    // the exit status; -1 when killed by a signal
	Signal string // e.g. "SIGKILL" when killed
}

func (e ExitStatus) String() string {
	if e.Signal != "" {
		return "killed by " + e.Signal
	}
	return "exit " + strconv.Itoa(e.Code)
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// runningAsRoot reports whether the agent may chown and switch users.
func runningAsRoot() bool { return os.Geteuid() == 0 }
