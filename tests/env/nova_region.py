"""A small Nova region in one process, built on Nova's own functional-test
fixtures (they ship in the wheel): in-memory sqlite databases and cells, an
in-process RPC transport with real asynchronous casts, conductor,
scheduler, and one compute service per fake host running
FakeLiveMigrateDriver, so live migrations really run through the
conductor, scheduler and both computes.

The Nova API is served on a real loopback port, with keystonemiddleware
validating real Keystone tokens (from the paste file written by
peers/nova.sh). Nova reaches Placement (a separate process) through the
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


def main():
    say("setting up the fixtures and services")
    region = Region("runTest")
    region.setUp()
    say("services started")
    app = nova_wsgi.Loader().load_app("osapi_compute")
    # Registers the API service record, as the real WSGI entry point does.
    wsgi_app._setup_service(CONF.host, "osapi_compute")
    sock = eventlet.listen(("127.0.0.1", C["port"]))
    # Line-buffered: tests and the benchmark count the requests in it as they happen.
    eventlet.spawn(eventlet.wsgi.server, sock, app, log=open(C["access_log"], "a", buffering=1), log_output=True)
    with open(ready_file + ".tmp", "w") as f:
        json.dump({"url": f"http://127.0.0.1:{C['port']}/v2.1", "hosts": C["hosts"]}, f)
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
