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
  * keeps the user's comment, where the workload is declared:
      sbatch --gpus=8 --comment "rlsched:model=MoE,samples=200000" job.sh
    (no model -> the controller's default profile).
--gres=gpu[:N], --gpus-per-node, --gpus-per-task and --gpus-per-socket are
refused in the managed partition: the controller decides the per-node split,
so ask for the total with --gpus=N. Job arrays, heterogeneous jobs and --hold
are refused for GPU jobs there too (one placement is one job; every GPU job is
held until placed, and a user cannot release it).

On modify, a non-admin cannot, for a managed job that has not started yet,
release it or change its priority, node list, node count, GPU request or
partition; nor give GPUs to a pending job of the managed partition that was
submitted without them, nor move a pending GPU job into that partition (either
would let Slurm start a GPU job the controller never placed: submit it anew).
Admins (root, SlurmUser: the controller) can. Users may still cancel.
]]

-- Partition whose GPU jobs the controller places. nil: the default partition.
-- scripts/local-cluster.sh rewrites this line.
local MANAGED_PARTITION = nil
-- Uids allowed to release / re-place managed jobs (root and the SlurmUser the
-- controller runs as). Add the SlurmUser's uid if it is not root.
local ADMIN_UIDS = { [0] = true }
local MARK = "rlsched:managed"
-- job_state value of a pending job (slurm.JOB_PENDING is not exported in 22.05)
local JOB_PENDING = slurm.JOB_PENDING or 0

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

function slurm_job_submit(job_desc, part_list, submit_uid)
   if not is_managed_partition(job_desc.partition, part_list) then
      return slurm.SUCCESS
   end
   if gpu_field(job_desc, SPLIT_FIELDS) ~= nil then
      slurm.log_user("rlsched: in this partition ask for the total number of GPUs with --gpus=N "
         .. "(the scheduler chooses the nodes); --gres=gpu:N, --gpus-per-node, --gpus-per-task "
         .. "and --gpus-per-socket are not accepted")
      return slurm.ERROR
   end
   local gpus = gpus_from_tres(job_desc.tres_per_job)
   if gpus == nil or gpus < 1 then
      return slurm.SUCCESS -- not a GPU job: Slurm schedules it as usual
   end
   -- the controller places one job on one node list: arrays and heterogeneous jobs would run
   -- several jobs (tasks, components) on one placement, or never run
   local refuse = nil
   if job_desc.array_inx ~= nil and job_desc.array_inx ~= "" then
      refuse = "job arrays of GPU jobs are not accepted in this partition: submit the tasks as separate jobs"
   elseif job_desc.het_job_offset ~= nil and job_desc.het_job_offset ~= slurm.NO_VAL then
      refuse = "heterogeneous GPU jobs are not accepted in this partition: submit the components as separate jobs"
   elseif job_desc.priority == 0 then
      refuse = "--hold is not accepted for GPU jobs in this partition (every GPU job waits until the "
         .. "scheduler places it); to start it later use --begin or --dependency"
   end
   if refuse ~= nil then
      slurm.log_user("rlsched: " .. refuse)
      return slurm.ERROR
   end
   job_desc.priority = 0
   job_desc.admin_comment = string.format("%s gpus=%d", MARK, gpus)
   slurm.log_info("rlsched: holding job %s of uid %d for the controller: gpus=%d comment=%s",
      tostring(job_desc.name), submit_uid, gpus, tostring(job_desc.comment))
   return slurm.SUCCESS
end

local function changed(v)
   return v ~= nil and v ~= slurm.NO_VAL and v ~= slurm.NO_VAL16 and v ~= ""
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   if ADMIN_UIDS[modify_uid] then
      return slurm.SUCCESS
   end
   -- once the job runs, placement fields no longer matter to us
   if job_rec.job_state ~= nil and job_rec.job_state ~= JOB_PENDING then
      return slurm.SUCCESS
   end
   local what = nil
   local ac = job_rec.admin_comment
   if ac == nil or string.find(ac, MARK, 1, true) == nil then
      -- not ours: it must not become a GPU job of the managed partition behind the controller's back
      local part = changed(job_desc.partition) and job_desc.partition or job_rec.partition
      if is_managed_partition(part, part_list) then
         if gpu_field(job_desc, ALL_FIELDS) ~= nil then
            what = "add GPUs to job " .. job_rec.job_id .. " of the managed partition"
         elseif changed(job_desc.partition) and gpu_field(job_rec, ALL_FIELDS) ~= nil then
            what = "move GPU job " .. job_rec.job_id .. " into the managed partition"
         end
      end
      if what ~= nil then
         slurm.log_info("rlsched: refused uid %d: cannot %s (submit a new job with --gpus=N)", modify_uid, what)
         return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
      end
      return slurm.SUCCESS
   end
   if changed(job_desc.priority) then
      what = "release it or change the priority"
   elseif changed(job_desc.req_nodes) then
      what = "change the node list"
   elseif changed(job_desc.min_nodes) or changed(job_desc.max_nodes) then
      what = "change the node count"
   elseif changed(job_desc.tres_per_job) or changed(job_desc.tres_per_node)
      or changed(job_desc.tres_per_task) or changed(job_desc.tres_per_socket) then
      what = "change the GPU request"
   elseif changed(job_desc.partition) then
      what = "change the partition"
   end
   if what ~= nil then
      -- log_user() is not delivered from job_modify; the caller sees
      -- "Access/permission denied", the reason goes to the slurmctld log
      slurm.log_info("rlsched: refused uid %d: cannot %s of managed job %d (placed by the rlsched controller)",
         modify_uid, what, job_rec.job_id)
      return slurm.ESLURM_ACCESS_DENIED or slurm.ERROR
   end
   return slurm.SUCCESS
end

slurm.log_info("rlsched job_submit.lua loaded")
return slurm.SUCCESS
