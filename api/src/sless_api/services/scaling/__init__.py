"""Scaling functions on in-flight calls: ``sless-scaler`` (KEDA's external push scaler) and its load reports.

Every API and event process counts, per function, the calls it has in flight and the calls waiting for a
replica, and sends the whole snapshot to the scaler every second while any is non-zero (:mod:`.reporter`), at
once when a call starts waiting for a function at zero. The scaler sums the live snapshots (:mod:`.aggregator`)
and answers KEDA (:mod:`.server`): ``StreamIsActive`` pushes the change from idle to active the moment a report
brings it, so a function at zero replicas starts without KEDA's polling delay; ``GetMetrics`` gives the HPA the
calls per function, which it divides by the trigger's ``target`` (calls in flight per pod).
"""
