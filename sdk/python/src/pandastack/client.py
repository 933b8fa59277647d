"""Connection settings and HTTP transport shared by :class:`Sandbox` and
:class:`AsyncSandbox`.

Most code never touches :class:`Client`: ``Sandbox.create()`` reads
``PANDASTACK_API_KEY`` and ``PANDASTACK_API`` from the environment. Build a
Client to talk to several servers, to pass a key explicitly, or to tune
timeouts::

    client = Client(api_key="pds_...", api_url="http://10.0.0.5:8080")
    sandbox = Sandbox.create(client=client)
"""

from __future__ import annotations

import asyncio
import json as jsonlib
import os
import threading
import weakref
from contextlib import asynccontextmanager, contextmanager
from typing import (
    Any,
    AsyncIterator,
    Dict,
    Iterator,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Tuple,
    Union,
)

import httpx

from ._version import __version__
from .exceptions import (
    APIConnectionError,
    ConfigurationError,
    PandaStackError,
    StreamError,
    TimeoutError,
    error_from_response,
)
from .models import TemplateInfo

__all__ = ["Client", "DEFAULT_API_URL", "API_KEY_ENV", "API_URL_ENV"]

DEFAULT_API_URL = "http://localhost:8080"
API_KEY_ENV = "PANDASTACK_API_KEY"
API_URL_ENV = "PANDASTACK_API"

# Seconds to wait for an answer when an operation has no timeout of its own.
# Creating a sandbox or starting a kernel takes seconds, not minutes, but a
# busy host can be slow: be generous rather than flaky.
DEFAULT_TIMEOUT = 300.0
CONNECT_TIMEOUT = 10.0

_MISSING_KEY = (
    f"{API_KEY_ENV} is not set: export the API key that `pandastack serve` printed on its first "
    f"start (it is also in <data dir>/api-key, e.g. /var/lib/pandastack/api-key), "
    f"or pass Client(api_key=...)"
)

Params = Union[Mapping[str, Any], List[Tuple[str, Any]], None]


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


class Client:
    """Where the PandaStack server is and which API key to use.

    Args:
        api_key: the API key (``pds_...``). Default: ``$PANDASTACK_API_KEY``;
            one of the two is required.
        api_url: the server's base URL. Default: ``$PANDASTACK_API``, else
            ``http://localhost:8080``.
        timeout: seconds to wait for an answer to a request that has no
            timeout of its own (create, files, ...). Requests that run
            something (exec, run_code) wait for their own timeout plus a
            margin instead.
        headers: extra HTTP headers sent with every request.

    A Client holds connection pools; it may be shared by any number of
    sandboxes and threads, and by coroutines of any event loop. ``close()``
    (or ``with Client(...) as c:``) releases the pools.

    Raises:
        ConfigurationError: no API key was given and ``PANDASTACK_API_KEY``
            is not set.
    """

    def __init__(
        self,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        headers: Optional[Mapping[str, str]] = None,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV, "")
        key = key.strip()
        if not key:
            raise ConfigurationError(_MISSING_KEY, code="missing_api_key")
        url = api_url or os.environ.get(API_URL_ENV, "").strip() or DEFAULT_API_URL
        if "://" not in url:
            url = "http://" + url
        self._api_key = key
        self._api_url = url.rstrip("/")
        self._timeout = float(timeout)
        self._headers: Dict[str, str] = {
            "Authorization": f"Bearer {key}",
            "User-Agent": f"pandastack-python/{__version__}",
        }
        if headers:
            self._headers.update(headers)
        self._lock = threading.Lock()
        self._http: Optional[httpx.Client] = None
        # One httpx.AsyncClient per event loop: its connections belong to the
        # loop that opened them.
        self._ahttp: "weakref.WeakKeyDictionary[Any, httpx.AsyncClient]" = weakref.WeakKeyDictionary()
        self._ahttp_other: Optional[httpx.AsyncClient] = None

    @property
    def api_url(self) -> str:
        """The server's base URL, without a trailing slash."""
        return self._api_url

    @property
    def api_key(self) -> str:
        """The API key in use."""
        return self._api_key

    def __repr__(self) -> str:
        return f"Client(api_url={self._api_url!r}, api_key='{self._api_key[:8]}…')"

    # ----- lifecycle -----------------------------------------------------

    def close(self) -> None:
        """Close the synchronous connection pool."""
        with self._lock:
            http, self._http = self._http, None
        if http is not None:
            http.close()

    async def aclose(self) -> None:
        """Close the connection pool of the running event loop (and the
        synchronous one)."""
        ah = self._pop_async_http()
        if ah is not None:
            await ah.aclose()
        self.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ----- plain calls -----------------------------------------------------

    def health(self) -> bool:
        """True when the server answers ``/healthz``."""
        try:
            body = self._request("GET", "/healthz", auth=False).json()
        except (PandaStackError, ValueError):
            return False
        return isinstance(body, dict) and body.get("status") == "ok"

    def list_templates(self) -> List[TemplateInfo]:
        """The templates the server has built and can create sandboxes from."""
        data = self._request("GET", "/v1/templates").json()
        return [TemplateInfo.from_dict(t) for t in data.get("templates") or []]

    async def alist_templates(self) -> List[TemplateInfo]:
        """Coroutine form of :meth:`list_templates`."""
        data = (await self._arequest("GET", "/v1/templates")).json()
        return [TemplateInfo.from_dict(t) for t in data.get("templates") or []]

    # ----- transport (used by Sandbox and AsyncSandbox) ----------------------

    def _timeout_for(self, read: Optional[float]) -> httpx.Timeout:
        r = self._timeout if read is None else read
        return httpx.Timeout(connect=CONNECT_TIMEOUT, read=r, write=max(r, self._timeout), pool=self._timeout)

    def _headers_for(self, extra: Optional[Mapping[str, str]], auth: bool) -> Dict[str, str]:
        h = dict(self._headers)
        if not auth:
            h.pop("Authorization", None)
        if extra:
            h.update(extra)
        return h

    def _sync_http(self) -> httpx.Client:
        with self._lock:
            if self._http is None:
                self._http = httpx.Client(base_url=self._api_url, timeout=self._timeout_for(None))
            return self._http

    def _async_http(self) -> httpx.AsyncClient:
        try:
            loop: Any = asyncio.get_running_loop()
        except RuntimeError:  # another async library (trio): one pool
            loop = None
        with self._lock:
            if loop is None:
                if self._ahttp_other is None:
                    self._ahttp_other = httpx.AsyncClient(base_url=self._api_url, timeout=self._timeout_for(None))
                return self._ahttp_other
            ah = self._ahttp.get(loop)
            if ah is None:
                ah = httpx.AsyncClient(base_url=self._api_url, timeout=self._timeout_for(None))
                self._ahttp[loop] = ah
            return ah

    def _pop_async_http(self) -> Optional[httpx.AsyncClient]:
        try:
            loop: Any = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            if loop is None:
                ah, self._ahttp_other = self._ahttp_other, None
                return ah
            return self._ahttp.pop(loop, None)

    def _build(
        self,
        http: Union[httpx.Client, httpx.AsyncClient],
        method: str,
        path: str,
        params: Params,
        json: Any,
        content: Any,
        headers: Optional[Mapping[str, str]],
        timeout: Optional[float],
        auth: bool,
    ) -> httpx.Request:
        h = self._headers_for(headers, auth)
        kw: MutableMapping[str, Any] = {}
        if json is not _UNSET:
            kw["content"] = jsonlib.dumps(json, separators=(",", ":")).encode()
            h["Content-Type"] = "application/json"
        elif content is not None:
            kw["content"] = content
        return http.build_request(method, path, params=params, headers=h, timeout=self._timeout_for(timeout), **kw)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = _UNSET,
        content: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        auth: bool = True,
    ) -> httpx.Response:
        """Send one request and return its answer, read in full. Error
        answers raise the matching :class:`PandaStackError`."""
        http = self._sync_http()
        req = self._build(http, method, path, params, json, content, headers, timeout, auth)
        with _translate(self._api_url, req):
            resp = http.send(req)
        _raise_for_status(resp)
        return resp

    @contextmanager
    def _stream(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = _UNSET,
        content: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Iterator[httpx.Response]:
        """Send one request and yield its answer unread, for streaming. Error
        answers raise before anything is yielded; transport failures while
        the body is read raise PandaStackError subclasses too."""
        http = self._sync_http()
        req = self._build(http, method, path, params, json, content, headers, timeout, True)
        with _translate(self._api_url, req):
            resp = http.send(req, stream=True)
            try:
                if resp.status_code >= 300:
                    resp.read()
                    _raise_for_status(resp)
                yield resp
            finally:
                resp.close()

    async def _arequest(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = _UNSET,
        content: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        auth: bool = True,
    ) -> httpx.Response:
        """Coroutine form of :meth:`_request`."""
        http = self._async_http()
        req = self._build(http, method, path, params, json, content, headers, timeout, auth)
        with _translate(self._api_url, req):
            resp = await http.send(req)
        _raise_for_status(resp)
        return resp

    @asynccontextmanager
    async def _astream(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = _UNSET,
        content: Any = None,
        headers: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> AsyncIterator[httpx.Response]:
        """Coroutine form of :meth:`_stream`."""
        http = self._async_http()
        req = self._build(http, method, path, params, json, content, headers, timeout, True)
        with _translate(self._api_url, req):
            resp = await http.send(req, stream=True)
            try:
                if resp.status_code >= 300:
                    await resp.aread()
                    _raise_for_status(resp)
                yield resp
            finally:
                await resp.aclose()


@contextmanager
def _translate(api_url: str, req: httpx.Request) -> Iterator[None]:
    """Turn httpx's transport exceptions into the SDK's."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise TimeoutError(
            f"{req.method} {req.url.path}: no answer within the client's timeout ({type(e).__name__})",
            code="client_timeout",
        ) from e
    except httpx.ConnectError as e:
        raise APIConnectionError(
            f"cannot reach the PandaStack server at {api_url}: {e}. Is `pandastack serve` running, "
            f"and does {API_URL_ENV} point at it?",
            code="connection_error",
        ) from e
    except (httpx.RemoteProtocolError, httpx.ReadError) as e:
        raise StreamError(
            f"{req.method} {req.url.path}: the connection broke off: {e}",
            code="stream_error",
        ) from e
    except httpx.TransportError as e:
        raise APIConnectionError(f"{req.method} {req.url.path}: {e}", code="connection_error") from e


def _raise_for_status(resp: httpx.Response) -> None:
    if resp.status_code < 300:
        return
    code: Optional[str] = None
    message = ""
    try:
        body = resp.json()
        err = body.get("error") if isinstance(body, dict) else None
        if isinstance(err, dict):
            code = err.get("code") or None
            message = err.get("message") or ""
    except ValueError:
        pass
    if not message:
        text = resp.text.strip()
        message = text[:500] if text else resp.reason_phrase or f"HTTP {resp.status_code}"
    raise error_from_response(code, message, resp.status_code)


_default_lock = threading.Lock()
_defaults: Dict[Tuple[str, str], Client] = {}


def default_client() -> Client:
    """The Client for the current ``PANDASTACK_API_KEY`` and ``PANDASTACK_API``.

    The environment is read on every call, so changing it takes effect on
    the next ``Sandbox.create()``; clients are reused per (key, URL).
    """
    key = os.environ.get(API_KEY_ENV, "").strip()
    if not key:
        raise ConfigurationError(_MISSING_KEY, code="missing_api_key")
    url = os.environ.get(API_URL_ENV, "").strip() or DEFAULT_API_URL
    with _default_lock:
        c = _defaults.get((key, url))
        if c is None:
            c = Client(api_key=key, api_url=url)
            _defaults[(key, url)] = c
        return c
