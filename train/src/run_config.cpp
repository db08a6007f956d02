#include "shardtensor/train/run_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include "shardtensor/core/error.hpp"

namespace shardtensor {

namespace {

DataConfig read_data(const ConfigNode& node, bool path_required) {
  node.allow_only({"path", "input", "target", "validation_path", "validation_samples",
                   "validation_fraction", "normalize", "shuffle", "prefetch", "periodic"});
  DataConfig d;
  d.path = path_required ? node.require<std::string>("path") : node.get("path", d.path);
  d.input = node.get("input", d.input);
  d.target = node.get("target", d.target);
  d.validation_path = node.get("validation_path", d.validation_path);
  d.validation_samples = node.get<Index>("validation_samples", d.validation_samples);
  d.validation_fraction = node.get("validation_fraction", d.validation_fraction);
  d.normalize = node.get("normalize", d.normalize);
  d.shuffle = node.get("shuffle", d.shuffle);
  d.prefetch = node.get("prefetch", d.prefetch);
  if (node.has("periodic"))
    d.periodic = node["periodic"].yaml().IsSequence()
                     ? node["periodic"].as<std::vector<bool>>()
                     : std::vector<bool>{node["periodic"].as<bool>()};
  node["validation_samples"].check(d.validation_samples >= 0 || !node.has("validation_samples"),
                                   "must be at least 0, got " + node["validation_samples"].text());
  node["validation_fraction"].check(
      d.validation_fraction >= 0 && d.validation_fraction < 1,
      "must lie in [0, 1), got " + std::to_string(d.validation_fraction));
  return d;
}

ParallelConfig read_parallel(const ConfigNode& node) {
  node.allow_only({"data_groups", "grid", "backend", "device_aware_mpi", "bf16_wire"});
  ParallelConfig p;
  const std::string backend = node.choice("backend", "mpi", {"mpi", "nccl"});
  node["backend"].check(backend != "nccl" || nccl_available(),
                        "'nccl' needs a CUDA build with NCCL; this build has none (use mpi)");
  p.comm.backend = backend == "nccl" ? CommBackend::nccl : CommBackend::mpi;
  p.comm.device_aware_mpi = node.get("device_aware_mpi", p.comm.device_aware_mpi);
  const std::string bf16_wire = node.choice("bf16_wire", "auto", {"auto", "on", "off"});
  p.comm.bf16_wire = bf16_wire == "on"    ? Bf16Wire::always
                     : bf16_wire == "off" ? Bf16Wire::never
                                          : Bf16Wire::automatic;
  p.data_groups = node.get("data_groups", p.data_groups);
  node["data_groups"].check(p.data_groups >= 1,
                            "must be at least 1, got " + node["data_groups"].text());
  p.grid = node.get("grid", p.grid);
  for (int g : p.grid)
    node["grid"].check(g >= 1, "entries must be positive, got " + node["grid"].text());
  return p;
}

OptimizerOptions read_optimizer(const ConfigNode& node) {
  node.allow_only(
      {"type", "lr", "momentum", "dampening", "weight_decay", "beta1", "beta2", "eps", "nesterov"});
  OptimizerOptions o;
  o.type = node.choice("type", o.type, {"sgd", "adam", "adamw"});
  o.lr = node.get("lr", o.lr);
  o.momentum = node.get("momentum", o.momentum);
  o.dampening = node.get("dampening", o.dampening);
  o.weight_decay = node.get("weight_decay", o.weight_decay);
  o.beta1 = node.get("beta1", o.beta1);
  o.beta2 = node.get("beta2", o.beta2);
  o.eps = node.get("eps", o.eps);
  o.nesterov = node.get("nesterov", o.nesterov);
  try {
    validate(o);
  } catch (const Error& e) {
    node.fail(e.what());
  }
  return o;
}

ScheduleOptions read_schedule(const ConfigNode& node, double base_lr) {
  node.allow_only(
      {"type", "warmup_steps", "warmup_start", "step_size", "gamma", "total_steps", "min_lr"});
  ScheduleOptions s;
  s.base_lr = base_lr;
  s.type = node.choice("type", s.type, {"constant", "step", "cosine"});
  s.warmup_steps = node.get("warmup_steps", s.warmup_steps);
  s.warmup_start = node.get("warmup_start", s.warmup_start);
  s.step_size = node.get("step_size", s.step_size);
  s.gamma = node.get("gamma", s.gamma);
  s.total_steps = node.get("total_steps", s.total_steps);  // 0: filled in by the trainer
  s.min_lr = node.get("min_lr", s.min_lr);
  return s;
}

TrainingConfig read_training(const ConfigNode& node) {
  node.allow_only({"epochs", "batch_size", "loss", "clip_grad_norm", "validate_every",
                   "checkpoint_every", "keep_checkpoints", "precision", "tf32", "seed"});
  TrainingConfig t;
  t.epochs = node.get("epochs", t.epochs);
  t.batch_size = node.get("batch_size", t.batch_size);
  t.loss = node.choice("loss", t.loss, {"mse", "l1", "relative_l2"});
  t.clip_grad_norm = node.get("clip_grad_norm", t.clip_grad_norm);
  t.validate_every = node.get("validate_every", t.validate_every);
  t.checkpoint_every = node.get("checkpoint_every", t.checkpoint_every);
  t.keep_checkpoints = node.get("keep_checkpoints", t.keep_checkpoints);
  t.precision = node.choice("precision", t.precision, {"float", "double", "bf16"});
  t.tf32 = node.get("tf32", t.tf32);
  t.seed = node.get("seed", t.seed);
  node["epochs"].check(t.epochs >= 0, "must not be negative, got " + node["epochs"].text());
  node["batch_size"].check(t.batch_size >= 1,
                           "must be at least 1, got " + node["batch_size"].text());
  node["clip_grad_norm"].check(t.clip_grad_norm >= 0,
                               "must not be negative, got " + node["clip_grad_norm"].text());
  node["validate_every"].check(t.validate_every >= 1,
                               "must be at least 1, got " + node["validate_every"].text());
  node["checkpoint_every"].check(t.checkpoint_every >= 1,
                                 "must be at least 1, got " + node["checkpoint_every"].text());
  node["keep_checkpoints"].check(t.keep_checkpoints >= 1,
                                 "must be at least 1, got " + node["keep_checkpoints"].text());
  return t;
}

MemoryConfig read_memory(const ConfigNode& node) {
  node.allow_only({"budget_mib", "library_workspace_share"});
  MemoryConfig m;
  m.budget_mib = node.get("budget_mib", m.budget_mib);
  node["budget_mib"].check(
      std::isfinite(m.budget_mib) && m.budget_mib >= 0,
      "must be a number of MiB >= 0 (0: no budget), got " + node["budget_mib"].text());
  m.library_workspace_share = node.get("library_workspace_share", m.library_workspace_share);
  node["library_workspace_share"].check(
      m.library_workspace_share >= 0 && m.library_workspace_share <= 1,
      "must be a share of free memory from 0 to 1, got " + node["library_workspace_share"].text());
  return m;
}

}  // namespace

RunConfig RunConfig::load(const std::string& path, const std::vector<std::string>& overrides,
                          DataUse data_use) {
  return parse(read_config_file(path), path, overrides, data_use);
}

RunConfig RunConfig::parse(const std::string& yaml_text, const std::string& source,
                           const std::vector<std::string>& overrides, DataUse data_use) {
  ConfigNode root = ConfigNode::parse(yaml_text, source);
  if (!overrides.empty()) {
    YAML::Node tree = root.yaml();
    for (const std::string& o : overrides) apply_override(tree, o);
    // Re-parse the overridden tree so line numbers refer to the file where they can.
    root = ConfigNode(tree, "", source);
  }
  root.allow_only(
      {"run_dir", "data", "parallel", "model", "optimizer", "schedule", "training", "memory"});
  RunConfig c;
  c.run_dir = root.get("run_dir", c.run_dir);
  c.data = read_data(root["data"], data_use == DataUse::file);
  c.parallel = read_parallel(root["parallel"]);
  root["model"].check(root.has("model") && root.yaml()["model"].IsMap(),
                      "missing or not a map: the model to train (see docs/models.md)");
  c.model = root.yaml()["model"];
  c.optimizer = read_optimizer(root["optimizer"]);
  c.schedule = read_schedule(root["schedule"], c.optimizer.lr);
  c.training = read_training(root["training"]);
  c.memory = read_memory(root["memory"]);
  YAML::Emitter out;
  out << root.yaml();
  c.text = std::string(out.c_str()) + "\n";
  return c;
}

}  // namespace shardtensor
