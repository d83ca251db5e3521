"""Add and remove engine groups at the fleet's router, for both router implementations.

The routers keep their workers in memory only, so joining must be cheap to repeat:
``join`` and ``leave`` are idempotent and report whether they changed anything.

sglang-router (0.3.x) adds a worker asynchronously: ``POST /workers`` answers 202 at once
and the worker is listed only once its ``/health`` answers; another POST for the same URL
meanwhile starts a second add job that retries just as long. The client therefore
remembers the worker ids of adds it queued and, while ``GET /workers/{id}`` still shows
that add in flight, counts the worker as present. vllm-router (0.1.x) adds synchronously
(``POST /add_worker`` returns once the worker is healthy) and has no control-plane auth.

A router can be replaced by the other implementation at the same address (an operator
changes ``fleet_router.impl``; the routers restart one at a time before the engine hosts
learn of it), so the client the fleet uses asks each router what it is, and asks again
after any failure, rather than trusting its settings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ConfigDict

from vllm_fleet.tls.trust import TrustError, fleet_trust

T = TypeVar("T")

# Job states in which a queued sglang add may still register its worker.
_SGLANG_JOB_DONE = ("failed", "completed")


class RouterTarget(BaseModel):
    model_config = ConfigDict(extra="forbid")

    impl: Literal["sglang", "vllm"]
    url: str
    # The fleet CA's certificate: an https router is trusted by it alone (host_tls).
    ca_file: str | None = None


class RouterError(Exception):
    """A router refused or failed an operation (the message never holds a key)."""


class RouterUnreachable(RouterError):
    """No answer at all (refused, reset, timed out): nothing says which router it is."""


class RouterClient(Protocol):
    def workers(self) -> list[str]: ...
    def serving(self, model_id: str) -> list[str]: ...
    def healthy(self) -> list[str]: ...
    def join(self, url: str, api_key: str, model_id: str) -> bool: ...
    def leave(self, url: str) -> bool: ...
    def close(self) -> None: ...


def normalize_url(url: str) -> str:
    # Routers compare URLs as strings: "http://e:8100/" and "http://e:8100" are two workers.
    return url.rstrip("/")


def _short(text: str, secrets: tuple[str | None, ...], limit: int = 160) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


class _HttpRouter:
    """What both clients share: one connection pool and uniform, key-free errors."""

    def __init__(self, target: RouterTarget, headers: dict[str, str], timeout: float) -> None:
        self.url = normalize_url(target.url)
        self._secrets: tuple[str | None, ...] = tuple(headers.values())
        try:
            verify = fleet_trust(self.url, target.ca_file)
        except TrustError as err:
            raise RouterError(f"router {self.url}: {err}") from None
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, verify=verify
        )

    def close(self) -> None:
        self._http.close()

    def _request(
        self,
        operation: str,
        method: str,
        path: str,
        ok: tuple[int, ...],
        secrets: tuple[str | None, ...] = (),
        **kwargs: Any,
    ) -> httpx.Response:
        hidden = self._secrets + secrets
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            detail = _short(f"{type(err).__name__}: {err}", hidden)
            raise RouterUnreachable(f"router {self.url}: {operation} failed: {detail}") from None
        if response.status_code not in ok:
            body = _short(response.text, hidden)
            raise RouterError(
                f"router {self.url}: {operation} failed: HTTP {response.status_code}: {body}"
            )
        return response

    def _json(self, operation: str, response: httpx.Response) -> Any:
        try:
            return response.json()
        except ValueError:
            body = _short(response.text, self._secrets)
            raise RouterError(f"router {self.url}: {operation}: not JSON: {body}") from None


class SglangRouterClient(_HttpRouter):
    def __init__(self, target: RouterTarget, control_key: str | None, timeout: float) -> None:
        headers = {"Authorization": f"Bearer {control_key}"} if control_key else {}
        super().__init__(target, headers, timeout)
        # URL -> worker id of adds this client queued and has not yet seen listed.
        self._queued: dict[str, str] = {}

    def _workers(self) -> list[dict[str, Any]]:
        """``GET /workers``' entries, each with its url and id."""
        data = self._json("list workers", self._request("list workers", "GET", "/workers", (200,)))
        workers = data.get("workers") if isinstance(data, dict) else None
        if not isinstance(workers, list) or not all(
            isinstance(w, dict) and "url" in w and "id" in w for w in workers
        ):
            # vllm-router answers GET /workers too, without worker ids or models: the
            # caller (DetectingRouterClient) asks the router what it is.
            body = _short(str(data), self._secrets)
            raise RouterError(f"router {self.url}: list workers: no worker ids: {body}")
        return workers

    def _listed(self) -> dict[str, str]:
        """Listed (that is, added) workers: normalized URL -> worker id."""
        return {normalize_url(w["url"]): str(w["id"]) for w in self._workers()}

    def workers(self) -> list[str]:
        return sorted(self._listed())

    def serving(self, model_id: str) -> list[str]:
        """Workers of this model the router considers healthy (it routes to them)."""
        return self._healthy(model_id)

    def healthy(self) -> list[str]:
        """Workers the router considers healthy, whatever their model."""
        return self._healthy(None)

    def _healthy(self, model_id: str | None) -> list[str]:
        return sorted(
            normalize_url(w["url"])
            for w in self._workers()
            if w.get("is_healthy") and (model_id is None or w.get("model_id") in (model_id, None))
        )

    def _add_in_flight(self, url: str) -> bool:
        worker_id = self._queued.get(url)
        if worker_id is None:
            return False
        path = f"/workers/{quote(worker_id, safe='')}"
        response = self._request("check a queued add", "GET", path, (200, 404))
        if response.status_code == 404:  # e.g. the router restarted since
            return False
        job = self._json("check a queued add", response).get("job_status") or {}
        # No job status: the add finished and the worker exists.
        return job.get("job_type", "AddWorker") == "AddWorker" and (
            job.get("status") not in _SGLANG_JOB_DONE
        )

    def join(self, url: str, api_key: str, model_id: str) -> bool:
        url = normalize_url(url)
        if url in self._listed():
            self._queued.pop(url, None)
            return False
        if self._add_in_flight(url):
            return False
        body = {"url": url, "api_key": api_key, "model_id": model_id}
        response = self._request(
            f"add worker {url}", "POST", "/workers", (200, 201, 202), (api_key,), json=body
        )
        worker_id = self._json(f"add worker {url}", response).get("worker_id")
        if worker_id:
            self._queued[url] = str(worker_id)
        return True

    def leave(self, url: str) -> bool:
        url = normalize_url(url)
        worker_id = self._listed().get(url)
        if worker_id is None:
            return False
        self._queued.pop(url, None)
        path = f"/workers/{quote(worker_id, safe='')}"
        response = self._request(f"remove worker {url}", "DELETE", path, (200, 202, 204, 404))
        return response.status_code != 404


class VllmRouterClient(_HttpRouter):
    def __init__(self, target: RouterTarget, timeout: float) -> None:
        super().__init__(target, {}, timeout)

    def _listed(self) -> dict[str, str]:
        """Normalized URL -> the URL exactly as registered (removal needs that spelling)."""
        response = self._request("list workers", "GET", "/list_workers", (200,))
        urls = self._json("list workers", response).get("urls", [])
        return {normalize_url(u): u for u in urls}

    def workers(self) -> list[str]:
        return sorted(self._listed())

    def serving(self, model_id: str) -> list[str]:
        # vllm-router lists neither health nor model: a listed worker is one it routes to
        # (it drops workers that fail its health checks).
        del model_id
        return self.workers()

    def healthy(self) -> list[str]:
        return self.workers()

    def join(self, url: str, api_key: str, model_id: str) -> bool:
        # vllm-router takes neither: clients' own Authorization reaches the engine as is.
        del api_key, model_id
        url = normalize_url(url)
        if url in self._listed():
            return False
        response = self._request(
            f"add worker {url}", "POST", "/add_worker", (200, 400), params={"url": url}
        )
        if response.status_code == 400:
            if "already exists" in response.text:  # added by someone else meanwhile
                return False
            body = _short(response.text, ())
            raise RouterError(f"router {self.url}: add worker {url} failed: HTTP 400: {body}")
        return True

    def leave(self, url: str) -> bool:
        registered = self._listed().get(normalize_url(url))
        if registered is None:
            # Checked first: vllm-router answers 200 to removing a URL it does not have.
            return False
        self._request(
            f"remove worker {registered}",
            "POST",
            "/remove_worker",
            (200,),
            params={"url": registered},
        )
        return True


def identify(
    url: str, timeout: float = 5.0, ca_file: str | None = None
) -> Literal["sglang", "vllm"] | None:
    """Which router answers at url: vllm-router lists its workers at ``GET /list_workers``
    (open), sglang-router has no such path (404). None: it did not say."""
    try:
        verify = fleet_trust(url, ca_file)
        response = httpx.get(f"{normalize_url(url)}/list_workers", timeout=timeout, verify=verify)
        status = response.status_code
    except (httpx.HTTPError, TrustError):
        return None
    return "vllm" if status == 200 else "sglang" if status == 404 else None


class DetectingRouterClient:
    """The client of the implementation the router turns out to be.

    Starts with the one its settings name; after a failure it asks the router what it is and,
    when that changed, repeats the operation with the other client once."""

    def __init__(self, target: RouterTarget, control_key: str | None, timeout: float) -> None:
        self._target = target
        self._control_key = control_key
        self._timeout = timeout
        self._client = self._make(target.impl)

    @property
    def impl(self) -> str:
        return self._client_impl

    def _make(self, impl: Literal["sglang", "vllm"]) -> RouterClient:
        self._client_impl = impl
        target = self._target.model_copy(update={"impl": impl})
        if impl == "sglang":
            return SglangRouterClient(target, self._control_key, self._timeout)
        return VllmRouterClient(target, self._timeout)

    def _call(self, operation: Callable[[RouterClient], T]) -> T:
        try:
            return operation(self._client)
        except RouterUnreachable:
            raise  # asking again would only wait as long once more (a hung router)
        except RouterError:
            found = identify(self._target.url, self._timeout, self._target.ca_file)
            if found is None or found == self._client_impl:
                raise
        self._client.close()
        self._client = self._make(found)
        return operation(self._client)

    def workers(self) -> list[str]:
        return self._call(lambda c: c.workers())

    def serving(self, model_id: str) -> list[str]:
        return self._call(lambda c: c.serving(model_id))

    def healthy(self) -> list[str]:
        return self._call(lambda c: c.healthy())

    def join(self, url: str, api_key: str, model_id: str) -> bool:
        return self._call(lambda c: c.join(url, api_key, model_id))

    def leave(self, url: str) -> bool:
        return self._call(lambda c: c.leave(url))

    def close(self) -> None:
        self._client.close()


def router_client(
    target: RouterTarget, control_key: str | None, timeout: float = 5.0
) -> RouterClient:
    return DetectingRouterClient(target, control_key, timeout)
