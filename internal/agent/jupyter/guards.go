package jupyter

import (
	"crypto/rand"
	"encoding/binary"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Code the agent runs inside kernels for its own ends: caps that keep a
// cell's output from exhausting the kernel's memory, per-run environment
// variables, and reseeding after a restore. Each piece runs silently
// (no output, no history) and leaves no names in the user's namespace.

// droppedKey is the user expression that reports the kernel's own drops.
const droppedKey = "pandastack_dropped"

// PythonSetupCode is an Options.SetupCode for ipykernel. ipykernel buffers
// what a cell writes to stdout and stderr for 0.2 s and sends it as one
// message, and IPython 9 also keeps all of it in its output history, so a
// cell that writes fast (8000 writes of 64 KiB, or 1 MiB writes) makes the
// kernel hold hundreds of MB and die; and a huge last expression (a 200 MB
// string) is formatted, encoded and sent whole. So:
//   - IPython's output history is off;
//   - each stream's write keeps at most the cap's characters per cell and
//     counts the rest (reported through PythonDroppedExpr);
//   - str and bytes longer than the cap are shown truncated without
//     computing their whole repr, and any displayed text value is cut at
//     the cap, any other value over ResultsCap dropped with a note.
//
// exit() and quit() raise SystemExit, as sys.exit() does, instead of
// ending the kernel after the cell. It also runs PythonPlotsCode before
// the first cell after matplotlib's pyplot is imported (faster plots, see
// there).
//
// The cap starts at DefaultOutputCap; PythonOutputCapCode changes it.
var PythonSetupCode = `def _pandastack_setup():
    import sys
    import ipykernel.iostream as iostream
    from IPython import get_ipython
    ip = get_ipython()
    cap = [` + strconv.Itoa(DefaultOutputCap+1) + `]
    sent = {'stdout': 0, 'stderr': 0}
    dropped = {'stdout': 0, 'stderr': 0}
    iostream._pandastack_cap = cap
    iostream._pandastack_dropped = dropped

    # On the class: IPython's tee (below) saves and puts back the instance's
    # write around every cell, this one included, so an instance attribute
    # would not last; reset drops the one it leaves behind.
    orig_write = iostream.OutStream.write
    def write(self, s):
        name = getattr(self, 'name', None)
        if name not in sent or not isinstance(s, str):
            return orig_write(self, s)
        if not s:
            return 0  # IPython writes '' around each result: no flush for nothing
        n = len(s)
        room = cap[0] - sent[name]
        if n > room:
            # In bytes, as the agent counts what it cuts.
            dropped[name] += len(s[max(room, 0):].encode('utf-8', 'surrogatepass'))
            if room <= 0:
                return n
            s = s[:room]
        sent[name] += len(s)
        orig_write(self, s)
        return n
    iostream.OutStream.write = write

    def reset(*args):
        for k in sent:
            sent[k] = 0
            dropped[k] = 0
        for stream in (sys.stdout, sys.stderr):
            w = getattr(stream, '__dict__', {}).get('write')
            if getattr(w, '__func__', None) is orig_write:
                del stream.__dict__['write']
    ip.events.register('pre_run_cell', reset)

    # exit() and quit() end the cell, as sys.exit() does (SystemExit; the
    # kernel and its variables stay), not the kernel a moment after the
    # cell answered, which a later cell would then find dead. On the shell,
    # which both call (also after %reset, and with keep_kernel=).
    def ask_exit():
        raise SystemExit()
    ip.ask_exit = ask_exit

    # clear_output() starts the cell's output afresh, its cap too.
    pub = ip.display_pub
    orig_clear = pub.clear_output
    def clear_output(*args, **kwargs):
        for k in sent:
            sent[k] = 0
            dropped[k] = 0
        return orig_clear(*args, **kwargs)
    pub.clear_output = clear_output
` + pythonPlotsHook + `
    # What ipykernel and IPython do around every cell costs system calls,
    # 10-30 µs each in gVisor: some 750 for a cell of "1+1". Drop what
    # the agent, the kernel's only client, has no use for. Each piece
    # checks that the attribute it changes exists, as older ipykernels
    # have them too but other kernels may not.
    kernel = getattr(ip, 'kernel', None)
    if hasattr(kernel, '_execute_sleep'):
        # A 0.5 ms sleep before each reply, for clients that stop reading
        # at the reply; the agent waits for the idle status, which comes
        # after every output.
        kernel._execute_sleep = 0
    if hasattr(kernel, '_publish_execute_input'):
        # The cell's code echoed on iopub for other frontends; the agent
        # takes the busy status as the cell's start instead.
        kernel._publish_execute_input = lambda *args, **kwargs: None
    # A flush of stdout or stderr hands work to ipykernel's IOPub thread
    # and waits for it, four times per cell even when nothing was written.
    # Skip it when there is nothing to send: nothing buffered, no flush
    # pending or under way (an output being sent must still go before the
    # idle status).
    orig_flush, orig_do_flush = iostream.OutStream.flush, getattr(iostream.OutStream, '_flush', None)
    if orig_do_flush is not None:
        def do_flush(self):
            self.__dict__['_pandastack_flushing'] = self.__dict__.get('_pandastack_flushing', 0) + 1
            try:
                return orig_do_flush(self)
            finally:
                self.__dict__['_pandastack_flushing'] -= 1
        def flush(self):
            if (getattr(self, '_buffers', True) or getattr(self, '_flush_pending', True)
                    or getattr(self, '_subprocess_flush_pending', True) or self.__dict__.get('_pandastack_flushing', 0)):
                return orig_flush(self)
        iostream.OutStream._flush = do_flush
        iostream.OutStream.flush = flush
    # A message with a lone surrogate (half of an emoji cut in two, as in
    # JSON data) failed to encode, and the whole of it was lost: a cell's
    # buffered stdout (with a traceback of tornado's on stderr instead), or
    # its exception (a UnicodeEncodeError in its place). Such a message is
    # sent with each lone surrogate as U+FFFD, pairs joined.
    session = getattr(kernel, 'session', None)
    orig_pack = getattr(session, 'pack', None)
    if callable(orig_pack):
        def clean(o):
            if isinstance(o, str):
                return o.encode('utf-16-le', 'surrogatepass').decode('utf-16-le', 'replace')
            if isinstance(o, dict):
                return {clean(k): clean(v) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [clean(v) for v in o]
            return o
        def pack(obj):
            try:
                return orig_pack(obj)
            except UnicodeEncodeError:
                return orig_pack(clean(obj))
        session.pack = pack
    # A cell with a top-level await runs as a task on the kernel's loop,
    # and SIGINT is to cancel it; ipykernel's handler hands the cancel to
    # another thread's loop, so it took effect only when the cell's await
    # ended of itself (an interrupt of await asyncio.sleep(60) waited the
    # minute, and a timeout restarted the kernel, its state lost). The
    # cancel goes to the cell's own loop, which it wakes.
    if callable(getattr(kernel, '_cancel_on_sigint', None)):
        import asyncio, contextlib, signal
        @contextlib.contextmanager
        def cancel_on_sigint(future):
            loop = asyncio.get_running_loop()
            def cancel():
                if not future.done():
                    future.cancel()
            def on_sigint(*args):
                loop.call_soon_threadsafe(cancel)
            saved = signal.signal(signal.SIGINT, on_sigint)
            try:
                yield
            finally:
                signal.signal(signal.SIGINT, saved)
        kernel._cancel_on_sigint = cancel_on_sigint
    # !cmd, %pip and x = !cmd run the command on a terminal nobody types
    # into (pexpect's): one that reads its input (!cat, the prompt of pip
    # uninstall) waited for the cell's timeout. They read /dev/null
    # instead, as the kernel's own subprocesses do: end of file at once.
    import IPython.core.interactiveshell as ishell
    zmqshell = sys.modules.get('ipykernel.zmqshell')
    def no_input(run):
        def run_without_input(cmd, *args, **kwargs):
            return run('exec </dev/null; ' + cmd, *args, **kwargs)
        return run_without_input
    for mod, name in ((zmqshell, 'system'), (ishell, 'system'), (ishell, 'getoutput')):
        if callable(getattr(mod, name, None)):
            setattr(mod, name, no_input(getattr(mod, name)))
    # The input history goes to its SQLite file every 20 cells rather
    # than after each (some 60 calls of its thread per cell); %history
    # writes it out first whenever it reads the file. A kernel killed
    # (restart, out of memory) loses up to 19 cells of it for the
    # sessions after, not for its own.
    hm = getattr(ip, 'history_manager', None)
    if hm is not None and getattr(hm, 'db_cache_size', 20) < 20:
        hm.db_cache_size = 20

    # IPython 9 tees every write of a cell into its history (kept for the
    # kernel's life, uncapped, above our cap): 500 MB printed is 500 MB
    # held. The platform has no use for output history.
    if hasattr(ip, '_tee'):
        import contextlib
        ip._tee = lambda channel: contextlib.nullcontext()

    # %reset out drops the output cache and _, __ and ___, but IPython's
    # note of those three as its own (user_ns_hidden) keeps the last
    # results alive: a 200 MB result stayed in memory after del and
    # %reset -f out, until three more results pushed it out.
    dh = getattr(ip, 'displayhook', None)
    dh_flush = getattr(dh, 'flush', None)
    if dh_flush is not None and isinstance(getattr(ip, 'user_ns_hidden', None), dict):
        def flush_results():
            dh_flush()
            for name in ('_', '__', '___'):
                if name in ip.user_ns_hidden:
                    ip.user_ns_hidden[name] = ip.user_ns.get(name, '')
        dh.flush = flush_results

    # Results are cut at the output cap too, but never below 64 Ki
    # characters (a small cap is for streams).
    def rcap():
        return max(cap[0], 1 << 16)

    formatter = ip.display_formatter
    plain = formatter.formatters['text/plain']
    from IPython.lib import pretty
    def long_printer(type_):
        try:
            short = plain.lookup_by_type(type_)
        except KeyError:
            short = pretty._type_pprinters.get(type_) or (lambda obj, p, cycle: p.text(repr(obj)))
        def printer(obj, p, cycle):
            if len(obj) <= rcap():
                return short(obj, p, cycle)
            keep = rcap() - 200  # so that the note stays within the cap
            p.text(repr(obj[:keep]) + '... [result truncated: %d of %d items shown]' % (keep, len(obj)))
        return printer
    for t in (str, bytes, bytearray):
        plain.for_type(t, long_printer(t))

    big = ` + strconv.Itoa(ResultsCap) + `
    fmt = formatter.format
    def format(obj, include=None, exclude=None):
        data, md = fmt(obj, include=include, exclude=exclude)
        for mime, v in list(data.items()):
            if isinstance(v, str) and mime.startswith('text/') and len(v) > rcap():
                data[mime] = v[:rcap()] + '\n[result truncated: %d characters omitted]' % (len(v) - rcap())
            elif isinstance(v, (str, bytes)) and len(v) > big:
                del data[mime]
                note = '[result too large: its %s form (%d MiB) was omitted; save it to a file and download that]' % (mime, len(v) >> 20)
                plain_text = data.get('text/plain', '')
                data['text/plain'] = note + ('\n' + plain_text if plain_text and mime != 'text/plain' else '')
        return data, md
    formatter.format = format
_pandastack_setup()
del _pandastack_setup
`

// PythonOutputCapCode is an Options.OutputCapCode for PythonSetupCode. One
// more character than the cap goes through, so the agent sees the cap
// passed and says so.
func PythonOutputCapCode(n int) string {
	return "__import__('ipykernel.iostream', fromlist=['_'])._pandastack_cap[0] = " + strconv.Itoa(n+1) + "\n"
}

// PythonDroppedExpr is an Options.DroppedExpr for PythonSetupCode.
const PythonDroppedExpr = "__import__('ipykernel.iostream', fromlist=['_'])._pandastack_dropped"

var droppedRE = regexp.MustCompile(`'(stdout|stderr)':\s*(\d+)`)

// parseDropped reads the text/plain of PythonDroppedExpr's value, a dict
// such as {'stdout': 0, 'stderr': 12}.
func parseDropped(s string) (stdout, stderr int) {
	for _, m := range droppedRE.FindAllStringSubmatch(s, -1) {
		n, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		if m[1] == "stdout" {
			stdout = n
		} else {
			stderr = n
		}
	}
	return stdout, stderr
}

// PythonReseedCode is an Options.ReseedCode for ipykernel: it reseeds
// from the OS's entropy what the interpreter seeded when it started —
// random's global generator, numpy's legacy global generator if numpy is
// loaded, tempfile's name sequence, multiprocessing's authentication key if
// loaded. The string hash seed cannot change in a running interpreter;
// docs/code-and-snapshots.md says so.
func PythonReseedCode() string {
	return `def _pandastack_reseed():
    import sys, random
    random.seed()
    tempfile = sys.modules.get('tempfile')
    if tempfile is not None:
        tempfile._name_sequence = None
    np = sys.modules.get('numpy')
    if np is not None:
        try:
            np.random.seed()
        except Exception:
            pass
    mp = sys.modules.get('multiprocessing')
    if mp is not None:
        import os
        mp.current_process().authkey = os.urandom(32)
_pandastack_reseed()
del _pandastack_reseed
`
}

// BashReseedCode is an Options.ReseedCode for the bash kernel: $RANDOM
// from a fresh seed.
func BashReseedCode() string {
	var b [4]byte
	rand.Read(b[:])
	return "RANDOM=" + strconv.FormatUint(uint64(binary.LittleEndian.Uint32(b[:])), 10) + "\n"
}

// RReseedCode is an Options.ReseedCode for IRkernel: R seeds its
// generator from the time and its pid, both alike in forks of one image,
// so it takes a seed from the host's randomness instead.
func RReseedCode() string {
	var b [4]byte
	rand.Read(b[:])
	return "set.seed(" + strconv.FormatUint(uint64(binary.LittleEndian.Uint32(b[:])>>1), 10) + "L)\n"
}

// BashWrapCode is an Options.WrapCode for the bash kernel: the cell's
// commands get /dev/null for stdin, so that one that reads input (read, cat)
// sees its end at once instead of waiting on the kernel's terminal until
// the cell times out. Braces, not a subshell: variables, functions and cd
// stay for the next cell; the ":" keeps a cell of comments only valid. Bash
// parses the group whole, so a shopt or alias takes effect from the next
// cell on, not later in its own.
// The shell variable it sets first tells the shell a cell began in from
// one bash_kernel started after it (BashShellSame).
func BashWrapCode(code string) string {
	return "__pandastack_shell=1; { :\n" + code + "\n} </dev/null"
}

// BashShellSame is an Options.ShellSame for BashWrapCode.
const BashShellSame = `[ -n "${__pandastack_shell-}" ]`

// BashShellExited is an Options.ShellExited for the bash kernel: what
// bash_kernel prints when a cell's `exit` ended its bash and it started
// another.
const BashShellExited = "Restarting Bash"

// RSetupCode is an Options.SetupCode for IRkernel: readline() fails at once
// (the kernel runs without stdin, as Python's input() does) rather than
// waiting until the cell times out.
// It is attached, not in the global environment, so rm(list = ls()) keeps it.
const RSetupCode = `local({
  e <- new.env()
  e$readline <- function(prompt = "") stop("readline(): this kernel has no input; pass values as variables or read them from a file", call. = FALSE)
  attach(e, name = "pandastack:input", warn.conflicts = FALSE)
})
`

// BashEnvCode is an Options.EnvCode for the bash kernel: it exports the
// variables for the cell and then puts back each one as it was (a value,
// exported or not, or unset).
func BashEnvCode(env map[string]string) (set, restore string) {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var s, r strings.Builder
	for i, k := range keys {
		saved := "__pandastack_env_" + strconv.Itoa(i)
		// declare -p prints a declare command that recreates the variable.
		s.WriteString(saved + "=$(declare -p " + k + " 2>/dev/null); export " + k + "=" + shellQuote(env[k]) + "\n")
		r.WriteString("unset " + k + "; if [ -n \"$" + saved + "\" ]; then eval \"$" + saved + "\"; fi; unset " + saved + "\n")
	}
	return s.String(), r.String()
}

// BashPathCode is an Options.SetupCode for the bash kernel: it sets its
// shell's PATH to path (the kernel process had more, to find its bash).
func BashPathCode(path string) string {
	return "export PATH=" + shellQuote(path) + "\n"
}

// shellQuote quotes s for bash as one word.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
