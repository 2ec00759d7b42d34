from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("node", "version", "uptime_s", "num_jobs", "store_url", "auth_scheme")
    NODE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    UPTIME_S_FIELD_NUMBER: _ClassVar[int]
    NUM_JOBS_FIELD_NUMBER: _ClassVar[int]
    STORE_URL_FIELD_NUMBER: _ClassVar[int]
    AUTH_SCHEME_FIELD_NUMBER: _ClassVar[int]
    node: str
    version: str
    uptime_s: float
    num_jobs: int
    store_url: str
    auth_scheme: str
    def __init__(self, node: _Optional[str] = ..., version: _Optional[str] = ..., uptime_s: _Optional[float] = ..., num_jobs: _Optional[int] = ..., store_url: _Optional[str] = ..., auth_scheme: _Optional[str] = ...) -> None: ...

class ProgressReport(_message.Message):
    __slots__ = ("job_key", "slurm_job_id", "step", "total_steps", "samples", "elapsed_s", "model", "checkpoint_step", "pid", "reference_samples_per_s", "comm_fraction", "rank", "world_size", "final", "state")
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    ELAPSED_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    REFERENCE_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    COMM_FRACTION_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    job_key: str
    slurm_job_id: str
    step: int
    total_steps: int
    samples: int
    elapsed_s: float
    model: str
    checkpoint_step: int
    pid: int
    reference_samples_per_s: float
    comm_fraction: float
    rank: int
    world_size: int
    final: bool
    state: str
    def __init__(self, job_key: _Optional[str] = ..., slurm_job_id: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., samples: _Optional[int] = ..., elapsed_s: _Optional[float] = ..., model: _Optional[str] = ..., checkpoint_step: _Optional[int] = ..., pid: _Optional[int] = ..., reference_samples_per_s: _Optional[float] = ..., comm_fraction: _Optional[float] = ..., rank: _Optional[int] = ..., world_size: _Optional[int] = ..., final: _Optional[bool] = ..., state: _Optional[str] = ...) -> None: ...

class ProgressAck(_message.Message):
    __slots__ = ("accepted", "store_url")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    STORE_URL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    store_url: str
    def __init__(self, accepted: _Optional[bool] = ..., store_url: _Optional[str] = ...) -> None: ...

class JobStatsRequest(_message.Message):
    __slots__ = ("job_key", "include_finished")
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_FINISHED_FIELD_NUMBER: _ClassVar[int]
    job_key: str
    include_finished: bool
    def __init__(self, job_key: _Optional[str] = ..., include_finished: _Optional[bool] = ...) -> None: ...

class JobStat(_message.Message):
    __slots__ = ("job_key", "slurm_job_id", "model", "step", "total_steps", "samples_per_s", "isolated_samples_per_s", "isolated_source", "cs", "last_checkpoint_step", "comm_fraction", "pids", "state", "last_report_age_s", "world_size")
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOTAL_STEPS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_SAMPLES_PER_S_FIELD_NUMBER: _ClassVar[int]
    ISOLATED_SOURCE_FIELD_NUMBER: _ClassVar[int]
    CS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    COMM_FRACTION_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    job_key: str
    slurm_job_id: str
    model: str
    step: int
    total_steps: int
    samples_per_s: float
    isolated_samples_per_s: float
    isolated_source: str
    cs: float
    last_checkpoint_step: int
    comm_fraction: float
    pids: _containers.RepeatedScalarFieldContainer[int]
    state: str
    last_report_age_s: float
    world_size: int
    def __init__(self, job_key: _Optional[str] = ..., slurm_job_id: _Optional[str] = ..., model: _Optional[str] = ..., step: _Optional[int] = ..., total_steps: _Optional[int] = ..., samples_per_s: _Optional[float] = ..., isolated_samples_per_s: _Optional[float] = ..., isolated_source: _Optional[str] = ..., cs: _Optional[float] = ..., last_checkpoint_step: _Optional[int] = ..., comm_fraction: _Optional[float] = ..., pids: _Optional[_Iterable[int]] = ..., state: _Optional[str] = ..., last_report_age_s: _Optional[float] = ..., world_size: _Optional[int] = ...) -> None: ...

class JobStatsResponse(_message.Message):
    __slots__ = ("node", "jobs")
    NODE_FIELD_NUMBER: _ClassVar[int]
    JOBS_FIELD_NUMBER: _ClassVar[int]
    node: str
    jobs: _containers.RepeatedCompositeFieldContainer[JobStat]
    def __init__(self, node: _Optional[str] = ..., jobs: _Optional[_Iterable[_Union[JobStat, _Mapping]]] = ...) -> None: ...

class PreemptRequest(_message.Message):
    __slots__ = ("job_key", "slurm_job_id", "timeout_s")
    JOB_KEY_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    job_key: str
    slurm_job_id: str
    timeout_s: float
    def __init__(self, job_key: _Optional[str] = ..., slurm_job_id: _Optional[str] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class PreemptResponse(_message.Message):
    __slots__ = ("ok", "checkpoint_step", "checkpoint_uri", "message", "process_exited", "wait_s", "operation_id", "done", "joined")
    OK_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_STEP_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_URI_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROCESS_EXITED_FIELD_NUMBER: _ClassVar[int]
    WAIT_S_FIELD_NUMBER: _ClassVar[int]
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    JOINED_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    checkpoint_step: int
    checkpoint_uri: str
    message: str
    process_exited: bool
    wait_s: float
    operation_id: str
    done: bool
    joined: bool
    def __init__(self, ok: _Optional[bool] = ..., checkpoint_step: _Optional[int] = ..., checkpoint_uri: _Optional[str] = ..., message: _Optional[str] = ..., process_exited: _Optional[bool] = ..., wait_s: _Optional[float] = ..., operation_id: _Optional[str] = ..., done: _Optional[bool] = ..., joined: _Optional[bool] = ...) -> None: ...

class PreemptStatusRequest(_message.Message):
    __slots__ = ("operation_id",)
    OPERATION_ID_FIELD_NUMBER: _ClassVar[int]
    operation_id: str
    def __init__(self, operation_id: _Optional[str] = ...) -> None: ...
