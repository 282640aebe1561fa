"""`/health` says "degraded", with the reason, while the newest published version cannot be loaded; the previous
version keeps serving. (It used to say "ok" while the server logged the failure on every poll.)"""

import time

from test_serve import ServerThread, _cfg  # tests/serve/ is on sys.path (rootdir conftest, no package)

from trinity_like.runtime.paths import namespace_of
from trinity_like.synchronizer import get_synchronizer
from trinity_like.weights.messages import WeightsInfo


def test_health_reports_a_failing_weight_load(ray_session, tmp_path, tiny_model_path):
    cfg = _cfg(tmp_path, tiny_model_path, "health")
    srv = ServerThread(cfg).start()
    try:
        assert srv.get("/health").json()["status"] == "ok"
        sync = get_synchronizer(namespace_of(cfg))
        missing = tmp_path / "nowhere" / "version-00000001"
        ray_session.get(sync.publish.remote(WeightsInfo(version=1, path=str(missing), method="checkpoint")))
        deadline = time.monotonic() + 30
        while (health := srv.get("/health").json())["status"] == "ok":
            assert time.monotonic() < deadline, "a failing load never showed in /health"
            time.sleep(0.3)
        assert health["status"] == "degraded" and health["model_version"] == 0
        assert "could not load the newest policy version" in health["reason"] and "nowhere" in health["reason"]
        # the previous version still answers
        answer = srv.client().chat.completions.create(model="p", messages=[{"role": "user", "content": "1+1="}],
                                                      max_tokens=2)
        assert answer.model_extra["model_version"] == 0
    finally:
        srv.stop()
