--[[
rlsched job_submit.lua: hand GPU jobs of the managed partition to the rlsched
controller.

Install: copy next to slurm.conf (slurmctld looks for job_submit.lua in the
directory of slurm.conf) and set JobSubmitPlugins=lua. Tested with Slurm 22.05.

On submit, a job of the managed partition that asks for GPUs with --gpus=N:
  * is held (priority 0): Slurm will not start it; the controller chooses its
    nodes, writes ReqNodeList/NumNodes and releases it;
  * is marked in its admin comment ("rlsched:managed gpus=N"), which users
    cannot edit; the controller only touches marked jobs;
  * is refused when it asks for more GPUs than the partition has (CAPACITY_FILE, written by the
    controller), with the partition's size in the message;
  * keeps the user's comment, where the workload is declared:
      sbatch --gpus=8 --comment "rlsched:model=MoE,samples=200000" job.sh
    (no model -> the controller's default profile).
Refused in the managed partition, with a message saying what to use instead:
  * --gres=gpu[:N], --gpus-per-node, --gpus-per-task, --gpus-per-socket (the
    controller decides the per-node split: ask for the total with --gpus=N) and
    GPU sharing GRES (mps, shard);
  * --exclusive (also =user, =mcs), for every job, GPU or not: a whole node
    comes with all its GPUs, which no one placed (a CPU job with --exclusive got
    all 8 GPUs of its node);
  * for GPU jobs: job arrays, heterogeneous jobs, --hold (one placement is one
    job; every GPU job is held until placed, and a user cannot release it), and
    -w/--nodelist/--nodefile and -x/--exclude (the controller chooses the nodes;
    a node list a user chose must never ride along on a held job).

On modify, a user (any uid not in ADMIN_UIDS) may change only the fields in
USER_MAY_CHANGE of a managed job, in any state: its comment, name, time limit,
dependency and mail settings. Everything else is refused (an allowlist: a
denylist missed `Nice=`, which releases a held job in Slurm 22.05), cleared
values included (`ReqNodeList=` arrives as ""). A job the controller does not
manage cannot be given GPUs in the managed partition, be moved into it, or
change its OverSubscribe/exclusive setting there (each would let Slurm start a
GPU job, or take a node's GPUs, that the controller never placed: submit it
anew). Admins (root, SlurmUser: the controller) can do anything. Users may
still cancel; `scontrol requeue` does not pass through here (the controller
holds such a job again).
]]

-- Partition whose GPU jobs the controller places. nil: the default partition.
-- scripts/local-cluster.sh rewrites this line.
local MANAGED_PARTITION = nil
-- Uids allowed to release / re-place managed jobs (root and the SlurmUser the
-- controller runs as). Add the SlurmUser's uid if it is not root.
local ADMIN_UIDS = { [0] = true }
local MARK = "rlsched:managed"
-- The managed partition's GPUs, written by the rlsched controller ([controller] capacity_file,
-- default state_dir/capacity: "key=value" lines partition, gpus, nodes, max_node_gpus). A GPU job
-- asking for more GPUs than the partition has is refused at submission. nil, or no readable file
-- (the controller has not run yet): no such check. scripts/local-cluster.sh rewrites this line.
local CAPACITY_FILE = nil
-- Slurm's ESLURM_JOB_HELD ("Job is in held state, pending scheduler release"), the same number from
-- Slurm 2.x to 25.x; job_modify returns it for a held managed job, ESLURM_ACCESS_DENIED otherwise
local ESLURM_JOB_HELD = 2042

-- What the owner of a managed job may still change with scontrol update: nothing here
-- touches priority, eligibility, begin time, node choice, resources, partition or sharing.
-- (time_limit: Slurm lets users only lower it; dependency: the controller judges it itself
-- and places a job only once it is met.)
local USER_MAY_CHANGE = {
   comment = true, name = true, time_limit = true, dependency = true,
   mail_type = true, mail_user = true,
}

-- Every field of the update request that slurmctld shows job_modify (in 22.05 job_desc is a
-- proxy that cannot be iterated, so the fields are named here), with how an unchanged field
-- reads (measured with scontrol update on slurmctld 22.05):
--   "s" string: nil; a cleared one (`ReqNodeList=`, `ExcNodeList=`) is "", which is a change
--   "n" number: NO_VAL, NO_VAL16 or NO_VAL64 (nil where the field is unknown)
--   "z" number: 0 (begin_time, end_time, immediate, *_board, power_flags) or NO_VAL
-- Names 22.05 does not know read nil (unchanged); they are here for newer versions.
-- Not checkable, as job_modify never sees them in 22.05: Deadline, MCSLabel, CoreSpec,
-- ClusterFeatures (nil) and bitflags (scontrol sets bits in it on every update).
local MODIFY_FIELDS = {
   { "account", "s" }, { "acctg_freq", "s" }, { "admin_comment", "s" }, { "array_inx", "s" },
   { "batch_features", "s" }, { "begin_time", "z" }, { "boards_per_node", "z" },
   { "burst_buffer", "s" }, { "cluster_features", "s" }, { "clusters", "s" }, { "comment", "s" },
   { "container", "s" }, { "contiguous", "n" }, { "core_spec", "n" }, { "cores_per_socket", "n" },
   { "cpu_freq_gov", "n" }, { "cpu_freq_max", "n" }, { "cpu_freq_min", "n" },
   { "cpus_per_task", "n" }, { "cpus_per_tres", "s" }, { "deadline", "z" }, { "delay_boot", "n" },
   { "dependency", "s" }, { "end_time", "z" }, { "exc_nodes", "s" }, { "extra", "s" },
   { "features", "s" }, { "group_id", "n" }, { "immediate", "z" }, { "licenses", "s" },
   { "mail_type", "n" }, { "mail_user", "s" }, { "max_cpus", "n" }, { "max_nodes", "n" },
   { "mcs_label", "s" }, { "mem_per_tres", "s" }, { "min_cpus", "n" }, { "min_mem_per_cpu", "n" },
   { "min_mem_per_node", "n" }, { "min_nodes", "n" }, { "name", "s" }, { "network", "s" },
   { "nice", "n" }, { "ntasks_per_board", "z" }, { "ntasks_per_core", "n" },
   { "ntasks_per_gpu", "n" }, { "ntasks_per_node", "n" }, { "ntasks_per_socket", "n" },
   { "ntasks_per_tres", "n" }, { "num_tasks", "n" }, { "partition", "s" },
   { "pn_min_cpus", "n" }, { "pn_min_memory", "n" }, { "pn_min_tmp_disk", "n" },
   { "power_flags", "z" }, { "prefer", "s" }, { "priority", "n" }, { "qos", "s" },
   { "reboot", "n" }, { "req_context", "s" }, { "req_nodes", "s" }, { "req_switch", "n" },
   { "requeue", "n" }, { "reservation", "s" }, { "segment_size", "n" },
   { "selinux_context", "s" }, { "shared", "n" }, { "site_factor", "n" },
   { "sockets_per_board", "z" }, { "sockets_per_node", "n" }, { "std_err", "s" },
   { "std_in", "s" }, { "std_out", "s" }, { "thread_spec", "n" }, { "threads_per_core", "n" },
   { "time_limit", "n" }, { "time_min", "n" }, { "tres_bind", "s" }, { "tres_freq", "s" },
   { "tres_per_job", "s" }, { "tres_per_node", "s" }, { "tres_per_socket", "s" },
   { "tres_per_task", "s" }, { "wait4switch", "n" }, { "wckey", "s" }, { "work_dir", "s" },
}

local NO_VAL64 = slurm.NO_VAL64 or 18446744073709551614.0
-- job_desc.shared: unset, or --oversubscribe; anything else (--exclusive: 0, =user: 2,
-- =mcs: 3, newer kinds) is an exclusive, whole-node request
local JOB_SHARED_OK = slurm.JOB_SHARED_OK or 1

local function unset_number(v)
   return v == slurm.NO_VAL or v == slurm.NO_VAL16 or v == NO_VAL64
end

-- true when the update request sets field value `v` of kind `kind` (see MODIFY_FIELDS)
local function changed(v, kind)
   if v == nil then return false end
   if kind == "s" then return true end -- "" clears the field: a change too
   if type(v) ~= "number" then return true end
   if kind == "z" and v == 0 then return false end
   return not unset_number(v)
end

local function nonempty(v)
   return v ~= nil and v ~= ""
end

local function gpus_from_tres(tres)
   -- "gres:gpu:4" (22.05), "gres/gpu:4" (23.x+), "gres:gpu:a100:4" -> 4; a GPU entry without a
   -- count ("gres:gpu" from --gres=gpu, "gres:gpu:a100") is one GPU, as Slurm reads it
   if tres == nil or tres == "" then return nil end
   local total = nil
   for entry in string.gmatch(tres, "[^,]+") do
      local rest = string.match(entry, "^gres[:/]gpu(.*)$") or string.match(entry, "^gpu(.*)$")
      if rest ~= nil and (rest == "" or string.sub(rest, 1, 1) == ":") then
         total = (total or 0) + (tonumber(string.match(rest, ":(%d+)$")) or 1)
      end
   end
   return total
end

-- GRES that share a GPU between jobs (CUDA MPS, 22.05+ shards): GPU access all the same
local SHARING_GRES = { mps = true, shard = true }

local function sharing_gres(tres)
   if tres == nil or tres == "" then return false end
   for entry in string.gmatch(tres, "[^,]+") do
      local name = string.match(entry, "^gres[:/]([^:]+)") or string.match(entry, "^([^:/]+)")
      if name ~= nil and SHARING_GRES[name] then return true end
   end
   return false
end

-- GPU requests other than --gpus=N (tres_per_job): per node (--gres=gpu:N,
-- --gpus-per-node), per task, per socket
local SPLIT_FIELDS = { "tres_per_node", "tres_per_task", "tres_per_socket" }
local ALL_FIELDS = { "tres_per_job", "tres_per_node", "tres_per_task", "tres_per_socket" }

-- the first of `fields` in which `t` asks for GPUs, or nil
local function gpu_field(t, fields)
   for _, f in ipairs(fields) do
      local n = gpus_from_tres(t[f])
      if n ~= nil and n > 0 then return f end
   end
   return nil
end

-- the first of `fields` in which `t` asks for a GPU sharing GRES (mps, shard), or nil
local function sharing_field(t, fields)
   for _, f in ipairs(fields) do
      if sharing_gres(t[f]) then return f end
   end
   return nil
end

local function default_partition(part_list)
   for name, part in pairs(part_list) do
      if part.flag_default ~= nil and part.flag_default ~= 0 then return name end
   end
   return nil
end

local function is_managed_partition(requested, part_list)
   local want = MANAGED_PARTITION or default_partition(part_list)
   if requested == nil or requested == "" then
      -- no partition given: the job goes to the default one
      return MANAGED_PARTITION == nil or MANAGED_PARTITION == default_partition(part_list)
   end
   for p in string.gmatch(requested, "[^,]+") do
      if p == want then return true end
   end
   return false
end

-- the controller's capacity file as a table (numbers as numbers), or nil when there is none
local function read_capacity()
   if CAPACITY_FILE == nil then return nil end
   local f = io.open(CAPACITY_FILE, "r")
   if f == nil then return nil end
   local cap = {}
   for line in f:lines() do
      local k, v = string.match(line, "^%s*([%w_]+)%s*=%s*(.-)%s*$")
      if k ~= nil then cap[k] = tonumber(v) or v end
   end
   f:close()
   if type(cap.gpus) ~= "number" then return nil end
   return cap
end

local function refuse_submit(why)
   slurm.log_user("rlsched: " .. why)
   return slurm.ERROR
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   if not is_managed_partition(job_desc.partition, part_list) then
      return slurm.SUCCESS
   end
   local shared = job_desc.shared
   if shared ~= nil and not unset_number(shared) and shared ~= JOB_SHARED_OK then
      return refuse_submit("--exclusive is not accepted in this partition (a whole node comes with "
         .. "all its GPUs, which the scheduler did not place): ask for the CPUs and memory you need "
         .. "(-n, -c, --mem), and for GPUs with --gpus=N")
   end
   if gpu_field(job_desc, SPLIT_FIELDS) ~= nil then
      return refuse_submit("in this partition ask for the total number of GPUs with --gpus=N "
         .. "(the scheduler chooses the nodes); --gres=gpu:N, --gpus-per-node, --gpus-per-task "
         .. "and --gpus-per-socket are not accepted")
   end
   if sharing_field(job_desc, ALL_FIELDS) ~= nil then
      return refuse_submit("GPU sharing GRES (--gres=mps:N, --gres=shard:N) are not accepted in this "
         .. "partition: ask for whole GPUs with --gpus=N")
   end
   local gpus = gpus_from_tres(job_desc.tres_per_job)
   if gpus == nil or gpus < 1 then
      return slurm.SUCCESS -- not a GPU job: Slurm schedules it as usual
   end
   -- the controller places one job on one node list: arrays and heterogeneous jobs would run
   -- several jobs (tasks, components) on one placement, or never run
   if job_desc.array_inx ~= nil and job_desc.array_inx ~= "" then
      return refuse_submit("job arrays of GPU jobs are not accepted in this partition: submit the tasks as separate jobs")
   elseif job_desc.het_job_offset ~= nil and job_desc.het_job_offset ~= slurm.NO_VAL then
      return refuse_submit("heterogeneous GPU jobs are not accepted in this partition: submit the components as separate jobs")
   elseif job_desc.priority == 0 then
      return refuse_submit("--hold is not accepted for GPU jobs in this partition (every GPU job waits until the "
         .. "scheduler places it); to start it later use --begin or --dependency")
   elseif nonempty(job_desc.req_nodes) then
      -- refused, not dropped: a silently ignored -w would surprise its user, and a held job must
      -- never carry a node list its user chose (it would run there if it got out of the hold)
      return refuse_submit("-w/--nodelist/--nodefile is not accepted for GPU jobs in this partition: "
         .. "the scheduler chooses the nodes")
   elseif nonempty(job_desc.exc_nodes) then
      return refuse_submit("-x/--exclude is not accepted for GPU jobs in this partition: the scheduler "
         .. "chooses the nodes (ask an administrator to drain a faulty node)")
   end
   local cap = read_capacity()
   if cap ~= nil and gpus > cap.gpus then
      -- the job could never start: say so now, not by holding it forever
      local where = (cap.partition ~= nil and cap.partition ~= "") and ("partition " .. cap.partition) or "this partition"
      local shape = ""
      if type(cap.nodes) == "number" and type(cap.max_node_gpus) == "number" then
         shape = string.format(" (%d nodes, at most %d GPUs each)", cap.nodes, cap.max_node_gpus)
      end
      return refuse_submit(string.format("--gpus=%d is more than the %d GPUs of %s%s: the job could never start; "
         .. "ask for at most %d", gpus, cap.gpus, where, shape, cap.gpus))
   end
   job_desc.priority = 0
   job_desc.admin_comment = string.format("%s gpus=%d | rlsched: waiting for the scheduler's next round", MARK, gpus)
   slurm.log_info("rlsched: holding job %s of uid %d for the controller: gpus=%d comment=%s",
      tostring(job_desc.name), submit_uid, gpus, tostring(job_desc.comment))
   return slurm.SUCCESS
end

local function allowed_list()
   local names = {}
   for _, fk in ipairs(MODIFY_FIELDS) do
      if USER_MAY_CHANGE[fk[1]] then names[#names + 1] = fk[1] end
   end
   return table.concat(names, ", ")
end
local USER_MAY_CHANGE_TEXT = allowed_list()

-- The reason goes to the caller through log_user() where Slurm passes it on: from 23.02 job_modify has an
-- err_msg argument and scontrol prints the text. Slurm 22.05's job_modify has none: slurmctld drops the
-- text (logging "Use of log.user() in job_modify is not supported. Message discarded: (...)" at error
-- level) and its reply to scontrol carries only the return code, so the caller sees that code's text:
-- for a held managed job ESLURM_JOB_HELD's "Job is in held state, pending scheduler release" (its
-- AdminComment says where it stands: scontrol show job), else "Access/permission denied". The full
-- reason is also logged at info level in every version.
local function refuse_modify(modify_uid, what, held)
   slurm.log_info("rlsched: refused uid %d: cannot %s", modify_uid, what)
   slurm.log_user("rlsched: cannot %s", what)
   if held then return ESLURM_JOB_HELD end
   return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if ADMIN_UIDS[modify_uid] then
      return slurm.SUCCESS
   end
   local ac = job_rec.admin_comment
   if ac ~= nil and string.find(ac, MARK, 1, true) ~= nil then
      -- a managed job, in any state (a requeued one is pending again, with its old priority)
      local refused = {}
      for _, fk in ipairs(MODIFY_FIELDS) do
         local f, kind = fk[1], fk[2]
         if not USER_MAY_CHANGE[f] and changed(job_desc[f], kind) then refused[#refused + 1] = f end
      end
      if #refused > 0 then
         return refuse_modify(modify_uid, string.format("change %s of managed job %d (placed by the rlsched "
            .. "controller; its owner may change only %s)", table.concat(refused, ", "), job_rec.job_id,
            USER_MAY_CHANGE_TEXT), job_rec.priority == 0)
      end
      return slurm.SUCCESS
   end
   -- not ours: it must not become a GPU job of the managed partition, or take a node's GPUs there,
   -- behind the controller's back
   local moves = changed(job_desc.partition, "s")
   local part = moves and job_desc.partition or job_rec.partition
   if not is_managed_partition(part, part_list) then
      return slurm.SUCCESS
   end
   local what = nil
   local id = string.format("%d", job_rec.job_id)
   if gpu_field(job_desc, ALL_FIELDS) ~= nil or sharing_field(job_desc, ALL_FIELDS) ~= nil then
      what = "add GPUs to job " .. id .. " of the managed partition"
   elseif moves and not is_managed_partition(job_rec.partition, part_list) then
      -- job_submit.lua's checks (GPUs, --exclusive) ran against the old partition; job_rec does
      -- not show --exclusive in 22.05, so no job may move in
      what = "move job " .. id .. " into the managed partition"
   elseif changed(job_desc.shared, "n") then
      what = "change OverSubscribe (--exclusive) of job " .. id .. " in the managed partition"
   end
   if what ~= nil then
      return refuse_modify(modify_uid, what .. " (submit a new job there; GPUs with --gpus=N)", false)
   end
   return slurm.SUCCESS
end

slurm.log_info("rlsched job_submit.lua loaded")
return slurm.SUCCESS
