"""Serve a WSGI application with gunicorn, with a clean sys.argv: OpenStack
services parse sys.argv with oslo.config when they build their app, and
would reject gunicorn's own options.

    serve_wsgi.py MODULE:ATTR HOST:PORT PIDFILE LOGFILE WORKERS
"""
import importlib
import sys

from gunicorn.app.base import BaseApplication

target, bind, pidfile, logfile, workers = sys.argv[1:6]
sys.argv = sys.argv[:1]


class App(BaseApplication):
    def load_config(self):
        for k, v in {"bind": bind, "workers": int(workers), "timeout": 120, "pidfile": pidfile,
                     "errorlog": logfile, "accesslog": None, "preload_app": False}.items():
            self.cfg.set(k, v)

    def load(self):
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


App().run()
