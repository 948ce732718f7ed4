from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
               0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST

disable_created_metrics()


class ServerMetrics:
    def __init__(self, model_name="glm-4.7"):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self.model_name = model_name
        self.num_requests_running = self._gauge("glmrt:num_requests_running",
                                                "Requests in the running batch of the engine.")
        self.num_requests_waiting = self._gauge("glmrt:num_requests_waiting",
                                                "Requests waiting for admission to the running batch.")
        self.num_requests_active = self._gauge("glmrt:num_requests_active",
                                               "Responses accepted by the server and not yet done.")
        self.kv_pages_used = self._gauge("glmrt:kv_pages_used", "KV cache pages in use.")
        self.kv_pages_total = self._gauge("glmrt:kv_pages_total", "KV cache pages in the pool.")
        self.kv_cache_usage_perc = self._gauge("glmrt:kv_cache_usage_perc",
                                               "Fraction of KV cache pages in use, 0 to 1.")
        self.engine_loaded = self._gauge("glmrt:engine_loaded", "1 once the engine is loaded and serving.")
        self.kv_pages_cached = self._gauge("glmrt:kv_pages_cached",
                                           "Pages without a holder that keep a reusable prefix (part of the free pages).")
        self.prefix_cache_queries = Counter("glmrt:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                                            labels, registry=self.registry).labels(model_name)
        self.prefix_cache_hits = Counter("glmrt:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                                         labels, registry=self.registry).labels(model_name)
        self.prefix_cache_evictions = Counter("glmrt:prefix_cache_evictions", "Cached pages evicted for reuse.",
                                              labels, registry=self.registry).labels(model_name)
        self.step_gap_seconds = Counter("glmrt:step_gap_seconds",
                                        "Host time from a step's completion to the launch of the next step that "
                                        "continues one of its requests (the device waits for it).", labels,
                                        registry=self.registry).labels(model_name)
        self.step_gaps = Counter("glmrt:step_gaps", "Steps that continued a request of the step before them.",
                                 labels, registry=self.registry).labels(model_name)
        self.device_forward_seconds = Counter("glmrt:device_forward_seconds",
                                              "Backend time of the forward passes (CUDA: device time between "
                                              "events around each step's work; CPU: the forward's wall time).",
                                              labels, registry=self.registry).labels(model_name)
        self.rows_owned_steps = Counter("glmrt:rows_owned_steps",
                                        "Steps in which each GPU reduced, normalised and routed only its own rows "
                                        "between the halves of the BF16 all-reduce.", labels,
                                        registry=self.registry).labels(model_name)
        self.steps_launched_ahead = Counter("glmrt:steps_launched_ahead",
                                            "Decode steps launched before the step they continue had completed, "
                                            "their tokens fed on the device.", labels,
                                            registry=self.registry).labels(model_name)
        self.seen_device_forward_ns = 0
        self.seen_rows_owned_steps = 0
        self.seen_steps_launched_ahead = 0
        self.seen_step_gap_ns = 0
        self.seen_step_gaps = 0
        self.seen_prefix_queries = 0
        self.seen_prefix_hits = 0
        self.seen_prefix_evictions = 0
        self.prompt_tokens = Counter("glmrt:prompt_tokens", "Prompt tokens admitted.", labels,
                                     registry=self.registry).labels(model_name)
        self.generation_tokens = Counter("glmrt:generation_tokens", "Tokens generated.", labels,
                                         registry=self.registry).labels(model_name)
        self.num_preemptions = Counter("glmrt:num_preemptions", "Requests preempted to recompute later.", labels,
                                       registry=self.registry).labels(model_name)
        self.admission_rejections = Counter("glmrt:admission_rejections", "Requests refused with 'overloaded'.",
                                            labels, registry=self.registry).labels(model_name)
        self._request_success = Counter("glmrt:request_success", "Finished responses by status and finish reason.",
                                        labels + ["status", "finished_reason"], registry=self.registry)
        self._request_errors = Counter("glmrt:request_errors", "Error events sent, by code.",
                                       labels + ["code"], registry=self.registry)
        self.time_to_first_token = self._histogram("glmrt:time_to_first_token_seconds",
                                                   "Time from request arrival to its first token.", TTFT_BUCKETS)
        self.inter_token_latency = self._histogram("glmrt:inter_token_latency_seconds",
                                                   "Time between consecutive tokens of one response.", ITL_BUCKETS)
        self.e2e_request_latency = self._histogram("glmrt:e2e_request_latency_seconds",
                                                   "Time from request arrival to response.done.", E2E_BUCKETS)
        self.step_duration = self._histogram("glmrt:step_duration_seconds", "Duration of one engine step.",
                                             STEP_BUCKETS)
        self.step_batch_size = self._histogram("glmrt:step_batch_size", "Requests in one engine step.",
                                               BATCH_BUCKETS)

    def _gauge(self, name, documentation):
        return Gauge(name, documentation, ["model_name"], registry=self.registry).labels(self.model_name)

    def _histogram(self, name, documentation, buckets):
        return Histogram(name, documentation, ["model_name"], buckets=buckets,
                         registry=self.registry).labels(self.model_name)

    def set_kv_pages(self, total, free):
        used = total - free
        self.kv_pages_total.set(total)
        self.kv_pages_used.set(used)
        self.kv_cache_usage_perc.set(used / total if total else 0.0)

    def set_prefix_cache(self, stats):
        self.kv_pages_cached.set(stats.kv_pages_cached)
        self.prefix_cache_queries.inc(max(0, stats.prefix_cache_queries - self.seen_prefix_queries))
        self.prefix_cache_hits.inc(max(0, stats.prefix_cache_hits - self.seen_prefix_hits))
        self.prefix_cache_evictions.inc(max(0, stats.prefix_cache_evictions - self.seen_prefix_evictions))
        self.seen_prefix_queries = stats.prefix_cache_queries
        self.seen_prefix_hits = stats.prefix_cache_hits
        self.seen_prefix_evictions = stats.prefix_cache_evictions

    def set_step_times(self, stats):
        self.device_forward_seconds.inc(max(0, stats.device_forward_ns - self.seen_device_forward_ns) / 1e9)
        self.seen_device_forward_ns = stats.device_forward_ns
        self.step_gap_seconds.inc(max(0, stats.step_gap_ns - self.seen_step_gap_ns) / 1e9)
        self.step_gaps.inc(max(0, stats.step_gaps - self.seen_step_gaps))
        self.seen_step_gap_ns = stats.step_gap_ns
        self.seen_step_gaps = stats.step_gaps
        self.rows_owned_steps.inc(max(0, stats.rows_owned_steps - self.seen_rows_owned_steps))
        self.seen_rows_owned_steps = stats.rows_owned_steps
        self.steps_launched_ahead.inc(max(0, stats.steps_launched_ahead - self.seen_steps_launched_ahead))
        self.seen_steps_launched_ahead = stats.steps_launched_ahead

    def set_queue_sizes(self, running, waiting):
        self.num_requests_running.set(running)
        self.num_requests_waiting.set(waiting)

    def count_finished(self, status, finish_reason):
        self._request_success.labels(self.model_name, status, finish_reason or "none").inc()

    def count_error(self, code):
        self._request_errors.labels(self.model_name, code).inc()

    def render(self):
        return generate_latest(self.registry)


def parse_metric_samples(text):
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0]
        try:
            samples[name] = samples.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return samples
