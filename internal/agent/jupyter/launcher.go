package jupyter

// PythonLauncher is the program that starts ipykernel in place of its own
// ipykernel_launcher (PythonLauncherArgv passes it with python3 -c). It is
// ipykernel's kernel with fewer thread hops per message; the Jupyter
// protocol, and what a cell can do, are the same.
//
// ipykernel 7 hands every message between threads: a shell request goes
// from libzmq's I/O thread to its "Shell channel" thread, then over an
// in-process socket to the main thread, which runs it; the reply takes the
// same way back; and every IOPub message (status, result, display, error)
// goes from the main thread to the "IOPub" thread, which sends it. Each hand-
// over is a futex or poll wake-up and a scheduler hop, 10-30 µs each in
// gVisor and several per message: the larger part of a "1+1" cell's time.
// So, with ipykernel 7 only (the version it was written and tested for;
// any other runs as ipykernel_launcher would):
//   - No shell channel thread: the main thread reads the shell socket
//     itself, as ipykernel 6 did and as ipykernel 7 still does when it has
//     no such thread. Its one loss is kernel subshells (concurrent shell
//     requests on other threads, which the agent never sends): kernel_info
//     no longer lists them, and ipykernel leaves a create_subshell_request
//     unanswered (it logs an error), as in any kernel without them.
//   - IOPub messages of the main thread, and of the IOPub thread itself, are
//     sent on the spot rather than queued for the IOPub thread; the socket is
//     used under one lock, so messages of other threads (the control thread,
//     threads of user code, subprocesses' output) still go through the IOPub
//     thread, which still sends stream output on its timer while a cell runs.
//     What the main thread sends stays in the order it sent it: streams are
//     flushed (and wait for the IOPub thread) before a result, an error or a
//     status, as before.
//     Once the kernel has forked (multiprocessing), the main thread queues
//     its messages for the IOPub thread again, as ipykernel does, so that they
//     stay behind the output children send back through it.
//   - The XPUB socket's subscriptions (each one answered by an iopub_welcome)
//     are read under the same lock, also after each send, since a send may
//     take the wake-up meant for the IOPub thread's loop.
//
// And, what ipykernel 7.4 gets wrong, for output written to the process's
// own stdout and stderr (a subprocess's, C code's), which ipykernel reads
// from a pipe on a thread of each stream, 1000 bytes at a time:
//   - The cell's reply waits until what that pipe held at the cell's end
//     is read and written to the stream (for at most 2 s; output that
//     comes later, from a background process say, does not hold it up). Before, a cell whose
//     subprocess wrote more than the thread had read when the cell ended
//     lost the rest: it came after the reply, with the finished cell's
//     header ("seq 1 10000" in a subprocess kept 4000 of 48894 bytes).
//   - A UTF-8 character split between two reads is decoded whole, not as
//     U+FFFD, and the thread reads up to 64 KiB at a time.
const PythonLauncher = `def main():
    import os, signal, sys, threading
    # A SIGHUP does not end the kernel: job control sends one (and a
    # SIGCONT) to a process group with a stopped member when it is
    # orphaned, which the agent's freeze of a cell's children (stopped,
    # then killed) did now and then, and the kernel died with its state.
    # A handler, not SIG_IGN: what the kernel starts gets the default.
    signal.signal(signal.SIGHUP, lambda signum, frame: None)
    # As ipykernel_launcher: no cwd on sys.path while ipykernel loads
    # (IPython puts it back for the user).
    if sys.path and sys.path[0] in ('', os.getcwd()):
        del sys.path[0]
    import ipykernel
    from ipykernel import kernelapp
    if ipykernel.version_info[0] != 7:
        kernelapp.launch_new_instance()
        return
    import codecs, fcntl, select, termios, time
    import zmq
    from ipykernel import iostream

    main_thread = threading.main_thread()

    class OutStream(iostream.OutStream):
        def _setup_stream_redirects(self, name):
            # Held by the watcher from a read to its write, and by drain;
            # _pds_read counts the bytes read and written so far.
            self._pds_lock = threading.Lock()
            self._pds_read = 0
            super()._setup_stream_redirects(name)

        def _watch_pipe_fd(self):
            if self._fid is None:
                return
            decoder = codecs.getincrementaldecoder('utf-8')('replace')
            self._pds_decoder = decoder
            poller = select.poll()
            poller.register(self._fid, select.POLLIN)
            try:
                while True:
                    poller.poll()
                    with self._pds_lock:
                        bts = os.read(self._fid, 65536)
                        if not bts or not self._should_watch:
                            break
                        text = decoder.decode(bts)
                        if text:
                            self.write(text)
                        os.write(self._original_stdstream_copy, bts)
                        self._pds_read += len(bts)
            except Exception:
                self._exc = sys.exc_info()

        def pds_drain(self, limit=2.0):
            """Waits until what the pipe held when it was called is read
            and written to the stream, or limit seconds have passed: one
            system call when the pipe is empty, and output that comes
            later (a background process that goes on writing) does not
            hold the reply up."""
            lock = getattr(self, '_pds_lock', None)
            if lock is None or self._fid is None or not self._should_watch:
                return  # (do_execute runs in the kernel's own process only)
            n = bytearray(4)
            with lock:
                fcntl.ioctl(self._fid, termios.FIONREAD, n)
                target = self._pds_read + int.from_bytes(n, sys.byteorder)
            end = time.monotonic() + limit
            try:
                while self._pds_read < target and time.monotonic() < end:
                    time.sleep(0.0005)
            except KeyboardInterrupt:
                pass  # an interrupt meant for the cell: the reply still goes
            # A character the cell began and never finished is the cell's
            # (U+FFFD), not the start of the next cell's output.
            decoder = getattr(self, '_pds_decoder', None)
            if decoder is not None and decoder.getstate()[0]:
                with lock:
                    fcntl.ioctl(self._fid, termios.FIONREAD, n)
                    if int.from_bytes(n, sys.byteorder) == 0:
                        text = decoder.decode(b'', final=True)
                        if text:
                            self.write(text)

    iostream.OutStream = OutStream  # what IPKernelApp's outstream_class names

    class NoShellChannelThread:
        """Stands for ipykernel 7's shell channel thread: false, so that
        ipykernel reads shell on the main thread; only parent_thread is read."""
        parent_thread = main_thread

        def __bool__(self):
            return False

    class IOPubThread(iostream.IOPubThread):
        _xpub = False

        def __init__(self, *args, **kwargs):
            self._socket_lock = threading.RLock()  # held for every use of self.socket
            self._forked = False
            super().__init__(*args, **kwargs)
            os.register_at_fork(before=self._before_fork, after_in_child=self._after_fork_in_child)

        def _before_fork(self):
            # A forked child's output comes back through the IOPub thread
            # (ipykernel's pipe), so from then on the main thread queues its
            # messages there too, behind any such output, as ipykernel does.
            self._forked = True

        def _after_fork_in_child(self):
            self._socket_lock = threading.RLock()  # it may have been held at the fork

        def _setup_xpub_listener(self):
            if getattr(self.socket, 'type', None) == zmq.XPUB:
                self._xpub = True
                self.io_loop.add_handler(self.socket, self._on_socket_events, self.io_loop.READ)

        def _on_socket_events(self, fd, events):
            self._read_subscriptions()

        def _read_subscriptions(self):
            with self._socket_lock:
                try:
                    while self.socket is not None and self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                        self._handle_subscription(self.socket.recv_multipart(zmq.NOBLOCK))
                except zmq.ZMQError:
                    pass  # closed, or nothing after all

        def _really_send(self, *args, **kwargs):
            with self._socket_lock:
                super()._really_send(*args, **kwargs)

        def send_multipart(self, *args, **kwargs):
            here = threading.current_thread()
            if ((here is self.thread or (here is main_thread and not self._forked))
                    and self.thread.is_alive() and self._is_master_process()):
                self._really_send(*args, **kwargs)
                if self._xpub:
                    self._read_subscriptions()
                return
            super().send_multipart(*args, **kwargs)

    kernelapp.IOPubThread = IOPubThread

    class KernelApp(kernelapp.IPKernelApp):
        def init_sockets(self):
            super().init_sockets()
            if self.shell_channel_thread is not None:
                self.shell_channel_thread.io_loop.close()  # never started
            self.shell_channel_thread = NoShellChannelThread()

        def init_kernel(self):
            base = self.kernel_class

            async def do_execute(self, code, silent, *args, **kwargs):
                reply = await base.do_execute(self, code, silent, *args, **kwargs)
                # ipykernel flushes the streams next, then replies. Silent
                # requests (the agent's own) show no output.
                if not silent:
                    for stream in (sys.stdout, sys.stderr):
                        drain = getattr(stream, 'pds_drain', None)
                        if drain is not None:
                            drain()
                    # What the output cap dropped, counted after the
                    # drain and whatever the cell's status (ipykernel
                    # evaluates user_expressions only for a cell that
                    # succeeded, and before the drain).
                    dropped = getattr(iostream, '_pandastack_dropped', None)
                    if isinstance(dropped, dict) and isinstance(reply, dict):
                        reply['pandastack_dropped'] = dict(dropped)
                return reply

            self.kernel_class = type(base.__name__, (base,), {
                '_supports_kernel_subshells': property(lambda self: False),
                'do_execute': do_execute,
            })
            super().init_kernel()

    KernelApp.launch_instance()

main()
`

// PythonLauncherArgv returns argv, an ipykernel kernelspec's command, with
// ipykernel_launcher replaced by PythonLauncher; any other command as is.
func PythonLauncherArgv(argv []string) []string {
	for i := 0; i+1 < len(argv); i++ {
		if argv[i] == "-m" && argv[i+1] == "ipykernel_launcher" {
			out := append([]string{}, argv[:i]...)
			out = append(out, "-c", PythonLauncher)
			return append(out, argv[i+2:]...)
		}
	}
	return argv
}
