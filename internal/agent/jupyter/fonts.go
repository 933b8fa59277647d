package jupyter

import "encoding/json"

// PythonMemFontsCode makes matplotlib read its fonts from memory. Its
// FT2Font reads a font file through the Python file object it opens (a
// seek and a read for each access FreeType makes): one small plot made
// some 2800 lseek and read calls, at ~30 µs each inside gVisor against
// ~1 µs natively, about 100 ms of the recipe's plot. Loaded from memory
// the fonts make none. The font objects are otherwise the same: fname
// still names the file (PDF and PS output embed it from there) and
// matplotlib's font cache works as before, each file read once per
// process. It does nothing before matplotlib.font_manager is imported,
// or once done; it leaves no name behind.
//
// It wraps matplotlib.font_manager._get_font (where every font matplotlib
// draws with is made, and cached): while that builds a font, io.open (which
// FT2Font calls to open a file by path) returns the file's bytes, on that
// thread only, and is put back right after.
const PythonMemFontsCode = `def _pandastack_memfonts():
    import functools, io, os, sys, threading
    fm = sys.modules.get('matplotlib.font_manager')
    if fm is None or getattr(fm._get_font, '_pandastack', False):
        return
    build = getattr(fm._get_font, '__wrapped__', None)
    if build is None:
        return
    real_open = io.open
    files = {}
    local = threading.local()

    def mem_open(file, mode='r', *args, **kwargs):
        if not getattr(local, 'on', False) or mode != 'rb' or args or kwargs:
            return real_open(file, mode, *args, **kwargs)
        key = os.fspath(file)
        data = files.get(key)
        if data is None:
            with real_open(file, 'rb') as f:
                data = files[key] = f.read()
        mem = io.BytesIO(data)
        mem.name = file  # FT2Font.fname reads it, as of a file opened by path
        return mem

    @functools.lru_cache(64)
    def _get_font(*args, **kwargs):
        local.on = True
        io.open = mem_open
        try:
            return build(*args, **kwargs)
        finally:
            local.on = False
            io.open = real_open

    _get_font._pandastack = True
    _get_font.__wrapped__ = build
    fm._get_font = _get_font
    # As matplotlib does for its own cache: fonts are not shared with a fork.
    if hasattr(os, 'register_at_fork'):
        os.register_at_fork(after_in_child=_get_font.cache_clear)
_pandastack_memfonts()
del _pandastack_memfonts
`

// pythonMemFontsHook is the part of PythonSetupCode that runs
// PythonMemFontsCode before the first cell after matplotlib's fonts were
// imported, in kernels that no warm-up primed (a spare runs it itself).
var pythonMemFontsHook = func() string {
	lit, _ := json.Marshal(PythonMemFontsCode) // a JSON string literal is a Python one
	return `
    def memfonts(*args):
        if 'matplotlib.font_manager' in sys.modules:
            ip.events.unregister('pre_run_cell', memfonts)
            try:
                exec(` + string(lit) + `, {})
            except Exception:
                pass
    ip.events.register('pre_run_cell', memfonts)
`
}()
