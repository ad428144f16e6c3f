"""Idempotent Keystone set-up through its REST API, as an operator would do
with the openstack CLI: projects, users, role assignments, catalog entries.

    keystone_admin.py URL ADMIN_PASSWORD user NAME PASSWORD PROJECT ROLE
    keystone_admin.py URL ADMIN_PASSWORD endpoint NAME TYPE PUBLIC_URL
"""
import json
import sys

import requests

url, admin_password, cmd, *args = sys.argv[1:]


def token():
    body = {"auth": {"identity": {"methods": ["password"], "password": {"user": {
        "name": "admin", "domain": {"id": "default"}, "password": admin_password}}},
        "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}}
    r = requests.post(f"{url}/auth/tokens", json=body, timeout=30)
    r.raise_for_status()
    return r.headers["X-Subject-Token"]


S = requests.Session()
S.headers["X-Auth-Token"] = token()


def find_or_create(kind, plural, name, body, query=None):
    q = {"name": name, **(query or {})}
    r = S.get(f"{url}/{plural}", params=q, timeout=30)
    r.raise_for_status()
    found = r.json()[plural]
    if found:
        return found[0]["id"]
    r = S.post(f"{url}/{plural}", json={kind: body}, timeout=30)
    if r.status_code >= 400:
        sys.exit(f"creating {kind} {name}: {r.status_code} {r.text}")
    return r.json()[kind]["id"]


if cmd == "user":
    name, password, project, role = args
    pid = find_or_create("project", "projects", project, {"name": project, "domain_id": "default"})
    uid = find_or_create("user", "users", name, {"name": name, "password": password, "domain_id": "default"})
    rid = find_or_create("role", "roles", role, {"name": role})
    S.put(f"{url}/projects/{pid}/users/{uid}/roles/{rid}", timeout=30).raise_for_status()
elif cmd == "endpoint":
    name, type_, public = args
    sid = find_or_create("service", "services", name, {"name": name, "type": type_})
    r = S.get(f"{url}/endpoints", params={"service_id": sid}, timeout=30)
    r.raise_for_status()
    if not r.json()["endpoints"]:
        for iface in ("public", "internal", "admin"):
            body = {"service_id": sid, "interface": iface, "url": public, "region_id": "RegionOne"}
            S.post(f"{url}/endpoints", json={"endpoint": body}, timeout=30).raise_for_status()
else:
    sys.exit(f"unknown command {cmd}")
print(json.dumps({"ok": cmd}))
