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

// PythonFastPNGCode makes the inline backend's PNG of a figure draw it
// once instead of twice. For bbox_inches="tight" (the inline default)
// matplotlib draws the whole figure once to measure it, then again into a
// canvas cropped to what was drawn: 40 ms of CPU out of 125 for the
// recipe's plot in gVisor. Drawn once at full size, measured on that same
// drawing and cropped, the PNG has the same size and content; edges may
// differ by a sub-pixel shift of the antialiasing (the tight redraw moves
// the figure by a fraction of a pixel; the crop is on whole pixels). The
// figure's background fills what the tight box adds past the figure's edge
// (at most its padding). Whenever that would not hold (something drawn
// past the figure's edge, a layout engine, a figure frame, retina or a
// savefig setting of the user's, another backend's canvas) it calls
// matplotlib's own path, and it does nothing unless the PNG formatter is
// still the inline backend's own (the user did not configure another). It
// leaves no name behind.
const PythonFastPNGCode = `def _pandastack_fastpng():
    import functools, sys
    figure = sys.modules.get('matplotlib.figure')
    pylabtools = sys.modules.get('IPython.core.pylabtools')
    if figure is None or pylabtools is None:
        return
    from IPython import get_ipython
    ip = get_ipython()
    formatter = ip.display_formatter.formatters['image/png']
    try:
        inline = formatter.lookup_by_type(figure.Figure)
    except KeyError:
        return
    if not (isinstance(inline, functools.partial) and inline.func is pylabtools.print_figure and inline.args == ()
            and inline.keywords == {'fmt': 'png', 'base64': True, 'bbox_inches': 'tight'}):
        return
    import binascii, io
    import numpy as np
    import matplotlib as mpl
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    def fast(fig):
        canvas = fig.canvas
        rc = mpl.rcParams
        if (not fig.axes and not fig.lines) or not isinstance(canvas, FigureCanvasAgg) \
                or type(canvas).print_png is not FigureCanvasAgg.print_png \
                or getattr(canvas, 'device_pixel_ratio', 1) != 1 \
                or getattr(fig, '_original_dpi', fig.dpi) != fig.dpi or fig.get_layout_engine() is not None \
                or fig.patch.get_linewidth() > 0 or rc['savefig.dpi'] != 'figure' or rc['savefig.transparent'] \
                or rc['savefig.pad_inches'] in (None, 'layout'):
            return None
        pad = float(rc['savefig.pad_inches'])
        canvas.draw()
        renderer = canvas.get_renderer()
        dpi = fig.dpi
        W, H = int(renderer.width), int(renderer.height)
        drawn = fig.get_tightbbox(renderer)
        if drawn.x0 < 0 or drawn.y0 < 0 or drawn.x1 * dpi > W or drawn.y1 * dpi > H:
            return None
        box = drawn.padded(pad)
        w, h = int(box.width * dpi), int(box.height * dpi)
        p = int(pad * dpi) + 2
        face = (np.asarray(mpl.colors.to_rgba(fig.get_facecolor())) * 255 + 0.5).astype(np.uint8)
        framed = np.empty((H + 2 * p, W + 2 * p, 4), np.uint8)
        framed[:] = face
        framed[p:p + H, p:p + W] = np.asarray(renderer.buffer_rgba())
        x, y = int(round(box.x0 * dpi)) + p, int(round(H - box.y1 * dpi)) + p
        out = io.BytesIO()
        mpl.image.imsave(out, framed[y:y + h, x:x + w], format='png', origin='upper', dpi=dpi)
        return binascii.b2a_base64(out.getvalue(), newline=False).decode('ascii')

    def png(fig):
        # A closed figure has a plain FigureCanvasBase; anything odd goes
        # matplotlib's own way.
        try:
            out = fast(fig)
        except Exception:
            out = None
        return inline(fig) if out is None else out

    png._pandastack = True
    formatter.for_type(figure.Figure, png)
_pandastack_fastpng()
del _pandastack_fastpng
`

// PythonPlotsCode is PythonMemFontsCode and PythonFastPNGCode.
const PythonPlotsCode = PythonMemFontsCode + PythonFastPNGCode

// pythonPlotsHook is the part of PythonSetupCode that runs PythonPlotsCode
// before each cell once matplotlib.pyplot is imported, until the inline
// backend has set up its PNG formatter (at the first figure): in kernels
// that no warm-up primed (a spare runs the pieces itself).
var pythonPlotsHook = func() string {
	lit, _ := json.Marshal(PythonPlotsCode) // a JSON string literal is a Python one
	return `
    plots_code = compile(` + string(lit) + `, '<pandastack>', 'exec')
    def plots(*args):
        if 'matplotlib.pyplot' not in sys.modules:
            return
        try:
            exec(plots_code, {})
            ip.display_formatter.formatters['image/png'].lookup_by_type(sys.modules['matplotlib.figure'].Figure)
        except KeyError:
            return  # no figure yet, so no inline PNG formatter to speed up
        except Exception:
            pass
        ip.events.unregister('pre_run_cell', plots)
    ip.events.register('pre_run_cell', plots)
`
}()
