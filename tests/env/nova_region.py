"""A small Nova region in one process, built on Nova's own functional-test
fixtures (they ship in the wheel): in-memory sqlite databases and cells, an
in-process RPC transport with real asynchronous casts, conductor,
scheduler, and one compute service per fake host running
FakeLiveMigrateDriver, so live migrations really run through the
conductor, scheduler and both computes.

The Nova API is served on a real loopback port, with keystonemiddleware
validating real Keystone tokens (from the paste file written by
peers/nova.sh). Besides eventlet's access log, every request is written
as a JSON line to the request log: when it arrived (UTC, microseconds), its
method, path, status and User-Agent (the coordinator names its replica
there), so tests can tell who called Nova when.

A control port (no authentication, loopback only) lets tests act on a fake
host as an operator would on a real one:
    POST /hosts/HOST/stop     stop its nova-compute (Nova's service group
                              sees it down after service_down_time)
    POST /hosts/HOST/start    start it again; a host whose compute service
                              was deleted registers a new one, as a
                              re-installed host does
    GET  /hosts               {"HOST": "running" | "stopped"}
    POST /simulated-hosts     {"prefix": P, "count": N}: compute service
                              and hypervisor records for hosts P00000 to
                              P{N-1, five digits}
                              (those missing), with no nova-compute
                              behind them; they report as up (their
                              services' last report is renewed every 15 s
                              in one statement), for the scale benchmark.
    POST /live-migrations     {"at_once": N}: Nova runs up to N live
                              migrations at once (its
                              max_concurrent_live_migrations; default 1).
                              Nova sizes one pool per process, so in this
                              one-process region the bound is region-wide,
                              not per host as in production; the eviction
                              benchmark sets it while nothing else migrates.
    POST /live-migrations/hold {"server": UUID, "seconds": S,
                              "obey_force": true|false}: that server's
                              live migrations from now on run S seconds
                              (default 5, as Nova's fake driver) unless
                              aborted, or forced to complete where
                              obey_force: a migration that will not
                              converge, as a busy guest's, for the
                              supervisor to force or abort.
Each fake host is a machine of its own: a libvirtd (peers/libvirt.sh) that
calls itself by the host's name, as Nova's record of the host does. For
each server the host's fake driver runs, a domain of the same UUID and
name runs there (libvirt's test driver), made and removed as the driver's
servers come and go (spawned, migrated in or out, evacuated, deleted), so
the host's agent reports what Nova means to run on it. A stopped host's
domains stay as they were.
Nova reaches Placement (a separate process) through the
Keystone catalog with its own service credentials, as in production.
Neutron, Glance and Cinder are Nova's fixtures.

    nova_region.py CONFIG_JSON READY_FILE
"""
import json
import os
import sys
import time

os.environ.setdefault("OS_TEST_TIMEOUT", "0")
os.environ.setdefault("OS_STDOUT_CAPTURE", "0")
os.environ.setdefault("OS_STDERR_CAPTURE", "0")

cfg_path, ready_file = sys.argv[1:3]
# Nova's fixtures capture stdout, stderr and logging; progress and fatal
# errors go to a duplicate of the original stderr so they reach our log.
_ERR = os.fdopen(os.dup(2), "w", buffering=1)


def say(msg):
    print(f"nova-region: {msg}", file=_ERR)
sys.argv = sys.argv[:1]
with open(cfg_path) as f:
    C = json.load(f)

from nova.tests.functional import integrated_helpers  # noqa: E402,F401  (eventlet patching)

import eventlet  # noqa: E402
import eventlet.semaphore  # noqa: E402
import eventlet.wsgi  # noqa: E402
from keystoneauth1 import loading as ks_loading  # noqa: E402
from nova import conf as nova_conf  # noqa: E402
from nova import test  # noqa: E402
from nova.api import wsgi as nova_wsgi  # noqa: E402
from nova.api.openstack import wsgi_app  # noqa: E402
from nova.tests import fixtures as nova_fixtures  # noqa: E402

CONF = nova_conf.CONF


class Region(test.TestCase):
    """Not a test: TestCase is the way to get Nova's fixtures set up."""

    NUMBER_OF_CELLS = 1

    def runTest(self):
        pass

    def setUp(self):
        super().setUp()
        self.useFixture(nova_fixtures.NeutronFixture(self))
        self.useFixture(nova_fixtures.GlanceFixture(self))
        self.useFixture(nova_fixtures.CinderFixture(self))
        self.useFixture(nova_fixtures.RealPolicyFixture())
        self.flags(api_paste_config=C["paste"], group="wsgi")
        # Nova -> Placement with its own service user, endpoint from the catalog.
        CONF.register_opts(ks_loading.get_auth_plugin_conf_options("password"), group="placement")
        self.flags(group="placement", auth_type="password", auth_url=C["auth_url"],
                   username="nova", password="nova-secret", project_name="service",
                   user_domain_name="Default", project_domain_name="Default",
                   region_name="RegionOne", valid_interfaces=["public"])
        self.flags(compute_driver="fake.FakeLiveMigrateDriver")
        self.flags(enable_new_services=True)
        # Hosts report resources and instances promptly.
        self.flags(update_resources_interval=10)
        # Tests boot as many servers as their scenario needs.
        self.flags(instances=-1, cores=-1, ram=-1, group="quota")
        self.conductor = self.start_service("conductor")
        self.scheduler = self.start_service("scheduler")
        self.computes = {h: self.start_service("compute", host=h) for h in C["hosts"]}


def request_log(app, path):
    """`app`, writing one JSON line per request to `path` (see the module doc)."""
    import datetime

    out = open(path, "a", buffering=1)

    def logged(environ, start_response):
        at = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
        seen = {}

        def start(status, headers, exc_info=None):
            seen["status"] = int(status.split()[0])
            return start_response(status, headers, exc_info)

        body = app(environ, start)
        out.write(json.dumps({"at": at, "method": environ.get("REQUEST_METHOD", ""),
                              "path": environ.get("PATH_INFO", ""), "status": seen.get("status"),
                              "user_agent": environ.get("HTTP_USER_AGENT", "")}) + "\n")
        return body

    return logged


def control_app(region):
    """The control port's WSGI app (see the module doc)."""

    def app(environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        parts = [p for p in path.split("/") if p]

        def answer(code, body):
            data = json.dumps(body).encode()
            start_response(code, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
            return [data]

        if method == "GET" and parts == ["hosts"]:
            return answer("200 OK", {h: ("stopped" if h in region.stopped else "running")
                                     for h in region.computes})
        if method == "POST" and len(parts) == 3 and parts[0] == "hosts" and parts[2] in ("stop", "start"):
            host, verb = parts[1], parts[2]
            if host not in region.computes:
                return answer("404 Not Found", {"error": f"no fake host {host}"})
            try:
                with region.control_lock:
                    if verb == "stop" and host not in region.stopped:
                        region.computes[host].stop()
                        region.stopped.add(host)
                    elif verb == "start":
                        if host not in region.stopped:
                            region.computes[host].stop()
                        region.computes[host] = region.start_service("compute", host=host)
                        region.stopped.discard(host)
            except Exception as e:  # the test that asked sees why
                say(f"control: {verb} {host} failed: {e!r}")
                return answer("500 Internal Server Error", {"error": repr(e)})
            say(f"control: {verb} {host}")
            return answer("200 OK", {"host": host, "state": "stopped" if host in region.stopped else "running"})
        if method == "POST" and parts == ["live-migrations", "hold"]:
            try:
                size = int(environ.get("CONTENT_LENGTH") or 0)
                body = json.loads(environ["wsgi.input"].read(size) or b"{}")
                HOLDS[str(body["server"])] = (float(body["seconds"]), bool(body.get("obey_force", True)))
            except Exception as e:  # the test that asked sees why
                return answer("400 Bad Request", {"error": repr(e)})
            say(f"control: live migrations of {body['server']} held {body['seconds']} s")
            return answer("200 OK", body)
        if method == "POST" and parts == ["live-migrations"]:
            try:
                size = int(environ.get("CONTENT_LENGTH") or 0)
                at_once = int(json.loads(environ["wsgi.input"].read(size) or b"{}")["at_once"])
                live_migrations_at_once(at_once)
            except Exception as e:  # the benchmark that asked sees why
                say(f"control: live migrations at once failed: {e!r}")
                return answer("500 Internal Server Error", {"error": repr(e)})
            say(f"control: up to {at_once} live migrations at once")
            return answer("200 OK", {"at_once": at_once})
        if method == "POST" and parts == ["simulated-hosts"]:
            try:
                size = int(environ.get("CONTENT_LENGTH") or 0)
                body = json.loads(environ["wsgi.input"].read(size) or b"{}")
                made = simulate_hosts(str(body["prefix"]), int(body["count"]))
            except Exception as e:  # the benchmark that asked sees why
                say(f"control: simulated hosts failed: {e!r}")
                return answer("500 Internal Server Error", {"error": repr(e)})
            return answer("200 OK", {"created": made})
        return answer("404 Not Found", {"error": f"no route {method} {path}"})

    return app


# Per server: how long its live migrations run, and whether a force to
# complete ends them. The fake driver keeps one flag per host for both, so
# forcing or aborting one migration ended every other one from that host.
HOLDS = {}
# Per server: "force" or "abort", asked of its migration in flight.
ENDINGS = {}
DEFAULT_HOLD = (5.0, True)


def hold_live_migrations():
    """FakeLiveMigrateDriver's live migration, held per server (HOLDS),
    and forced or aborted per server."""
    from nova.virt import fake

    def live_migration(self, context, instance, dest, post_method, recover_method,
                       block_migration=False, migrate_data=None):
        seconds, obey_force = HOLDS.get(instance.uuid, DEFAULT_HOLD)
        ENDINGS.pop(instance.uuid, None)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ending = ENDINGS.get(instance.uuid)
            if ending == "abort" or (ending == "force" and obey_force):
                break
            time.sleep(0.1)
        if ENDINGS.pop(instance.uuid, None) == "abort":
            recover_method(context, instance, dest, migrate_data, migration_status="cancelled")
        else:
            post_method(context, instance, dest, block_migration, migrate_data)

    def force_complete(self, instance):
        ENDINGS.setdefault(instance.uuid, "force")

    def abort(self, instance):
        ENDINGS[instance.uuid] = "abort"

    fake.FakeLiveMigrateDriver.live_migration = live_migration
    fake.FakeLiveMigrateDriver.live_migration_force_complete = force_complete
    fake.FakeLiveMigrateDriver.live_migration_abort = abort


def live_migrations_at_once(n):
    """Nova's live-migration pool, sized `n` from the next migration on.

    Nova makes the pool once per process, at the first live migration, from
    max_concurrent_live_migrations: the option is set and the pool dropped
    so the next migration makes it anew. Migrations already given to the
    old pool run there."""
    from nova import thread_pool_factory as pools
    from nova import utils

    if n < 1:
        raise ValueError(f"at_once must be 1 or more, not {n}")
    # A green pool shut down still runs what it was given; a thread pool's
    # workers would stop, and migrations queued there never run.
    if utils.concurrency_mode_threading():
        raise RuntimeError("Nova runs native threads here: its pool cannot be swapped safely")
    if n == 1:
        CONF.clear_override("max_concurrent_live_migrations")
    else:
        CONF.set_override("max_concurrent_live_migrations", n)
    with pools.FACTORY._shutdown_lock:
        old = pools.FACTORY._all_executors.pop(pools.ExecutorType.LIVE_MIGRATION, None)
    if old is not None:
        old.shutdown(wait=False)


SIMULATED_PREFIXES = set()


def _cell():
    from nova import context as nova_context
    from nova import objects

    ctxt = nova_context.get_admin_context()
    return ctxt, next(c for c in objects.CellMappingList.get_all(ctxt) if not c.is_cell0())


def _cell_context():
    from nova import context as nova_context

    ctxt, cell = _cell()
    return nova_context.target_cell(ctxt, cell)


def simulate_hosts(prefix, count):
    """Service and compute node records for hosts PREFIX0..PREFIX{count-1}
    that do not exist yet; answers how many were made."""
    from nova import objects
    from oslo_utils import uuidutils

    made = 0
    api_ctxt, cell = _cell()
    with _cell_context() as cctxt:
        have = {s.host for s in objects.ServiceList.get_by_binary(cctxt, "nova-compute")}
        for i in range(count):
            host = f"{prefix}{i:05d}"
            if host in have:
                continue
            svc = objects.Service(cctxt, host=host, binary="nova-compute", topic="compute", report_count=0)
            svc.create()
            cn = objects.ComputeNode(
                cctxt, uuid=uuidutils.generate_uuid(), host=host, hypervisor_hostname=host,
                service_id=svc.id, vcpus=64, memory_mb=524288, local_gb=2000, vcpus_used=0,
                memory_mb_used=0, local_gb_used=0, hypervisor_type="fake", hypervisor_version=1000,
                cpu_info="{}", free_ram_mb=524288, free_disk_gb=2000, current_workload=0,
                running_vms=0, disk_available_least=2000, host_ip="127.0.0.1", supported_hv_specs=[],
                metrics="[]", stats={}, cpu_allocation_ratio=16.0, ram_allocation_ratio=1.5,
                disk_allocation_ratio=1.0)
            cn.create()
            # The API finds a host's cell by its mapping: without one, its
            # hypervisor is left out of the lists.
            objects.HostMapping(api_ctxt, host=host, cell_mapping=cell).create()
            made += 1
            if made % 200 == 0:
                eventlet.sleep(0)
    SIMULATED_PREFIXES.add(prefix)
    _renew_simulated()
    say(f"control: {made} simulated hosts {prefix}00000..{prefix}{count - 1:05d} created")
    return made


def _renew_simulated():
    """Every simulated host's service reports now, in one statement."""
    from nova.db.main import api as main_db
    from nova.db.main import models
    from oslo_utils import timeutils

    @main_db.pick_context_manager_writer
    def renew(context):
        for prefix in SIMULATED_PREFIXES:
            context.session.query(models.Service).filter(models.Service.host.like(prefix + "%")).update(
                {"last_seen_up": timeutils.utcnow(), "report_count": models.Service.report_count + 1},
                synchronize_session=False)

    with _cell_context() as cctxt:
        renew(cctxt)


def renew_simulated_forever():
    while True:
        eventlet.sleep(15)
        if SIMULATED_PREFIXES:
            try:
                _renew_simulated()
            except Exception as e:
                say(f"renewing simulated hosts failed: {e!r}")


DOMAIN_XML = (
    "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid>"
    "<memory unit='MiB'>64</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain>"
)


class Machines:
    """The fake hosts' libvirtds, each holding a domain per server its host's
    fake driver runs. One connection to each is kept open: the test driver's
    state lives only as long as a connection holds it."""

    def __init__(self, region, uris):
        self.region, self.uris = region, uris
        self.conns, self.have = {}, {}

    def _conn(self, host):
        import libvirt

        conn = self.conns.get(host)
        if conn is None or not conn.isAlive():
            conn = libvirt.open(self.uris[host])
            self.conns[host] = conn
            # Ours are Nova's instance names; the test driver's own is not.
            self.have[host] = {d.UUIDString() for d in conn.listAllDomains() if d.name().startswith("instance-")}
        return conn

    def sync(self, host):
        compute = self.region.computes.get(host)
        if compute is None or host in self.region.stopped:
            return
        want = {u: i.name for u, i in list(compute.manager.driver.instances.items())}
        if want.keys() == self.have.get(host, set()) and host in self.conns:
            return
        conn = self._conn(host)
        have = self.have[host]
        for uuid in sorted(want.keys() - have):
            conn.createXML(DOMAIN_XML.format(name=want[uuid], uuid=uuid), 0)
            have.add(uuid)
        for uuid in sorted(have - want.keys()):
            conn.lookupByUUIDString(uuid).destroy()
            have.discard(uuid)

    def forever(self):
        import libvirt

        while True:
            for host in self.uris:
                try:
                    self.sync(host)
                except libvirt.libvirtError as e:
                    self.conns.pop(host, None)
                    say(f"machine {host}: {e}")
            eventlet.sleep(0.2)


def main():
    say("setting up the fixtures and services")
    hold_live_migrations()
    region = Region("runTest")
    region.setUp()
    region.stopped = set()
    # One start or stop at a time: Nova's service fixture patches module
    # functions while a service starts, and two starting together (two
    # tests reviving hosts) find each other's patch ("Cannot autospec a
    # Mock object").
    region.control_lock = eventlet.semaphore.Semaphore(1)
    say("services started")
    app = request_log(nova_wsgi.Loader().load_app("osapi_compute"), C["request_log"])
    # Registers the API service record, as the real WSGI entry point does.
    wsgi_app._setup_service(CONF.host, "osapi_compute")
    sock = eventlet.listen(("127.0.0.1", C["port"]))
    # Line-buffered: tests and the benchmark count the requests in it as they happen.
    eventlet.spawn(eventlet.wsgi.server, sock, app, log=open(C["access_log"], "a", buffering=1), log_output=True)
    control = eventlet.listen(("127.0.0.1", C["control_port"]))
    eventlet.spawn(eventlet.wsgi.server, control, control_app(region), log_output=False)
    eventlet.spawn(renew_simulated_forever)
    eventlet.spawn(Machines(region, C["libvirt"]).forever)
    with open(ready_file + ".tmp", "w") as f:
        json.dump({"url": f"http://127.0.0.1:{C['port']}/v2.1", "hosts": C["hosts"],
                   "control_url": f"http://127.0.0.1:{C['control_port']}"}, f)
    os.rename(ready_file + ".tmp", ready_file)
    say(f"ready: API on 127.0.0.1:{C['port']}, hosts {', '.join(C['hosts'])}")
    # The fixtures capture logs in memory: keep them from growing.
    while True:
        eventlet.sleep(5)
        for fx in (getattr(region, "stdlog", None),):
            logger = getattr(fx, "logger", None)
            out = getattr(logger, "_output", None)
            if out is not None and out.tell() > 1 << 20:
                out.seek(0)
                out.truncate()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc(file=_ERR)
        raise
