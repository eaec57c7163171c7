"""Engine handles: an engine (the networks loaded once, rendering checked jobs) that runs in a process of its own
(`process.ProcessEngine`, a child of this one) or in a Ray actor (`ray_engine.RayEngine`), seen by batch and serve
through one interface (`base.EngineHandle`). The parent outlives an engine that dies under a job."""
