"""A route's query parameters are given once each, and only those it takes.

Starlette keeps the last of a repeated parameter: `freeze?gpu=0&gpu=1` froze GPU 1 alone and
answered as if the request had been done, and `pods?namespace=a&namespace=b` listed b. A name
the route does not take was dropped as quietly: `pods?namesapce=team` listed every namespace,
`workers?pods=train` every worker. Both are a 422 naming the parameter. A route that takes no
query parameter is left alone: a Prometheus scrape configuration may add `params` to its
/metrics requests.
"""

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from vgpu_hypervisor.daemon.api.errors import ApiError


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route takes, its dependencies' included."""
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def query_given_once(request: Request) -> None:
    """An app-wide dependency: it runs after routing, so an unknown path is still a 404."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute):
        return
    taken = _query_names(route.dependant)
    if not taken:
        return
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in taken:
            expected = ", ".join(sorted(taken))
            raise ApiError(422, f"query.{name}: not a parameter of this request ({expected})")
        if name in seen:
            raise ApiError(422, f"query.{name}: given twice; give it once")
        seen.add(name)
