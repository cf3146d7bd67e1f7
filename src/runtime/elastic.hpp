// What the elastic supervisor (`alloy run`) decides between two launches of a training job: which
// rank the launcher saw die, and the cluster left without that rank's device.
#pragma once

#include <string>

#include "spec/cluster.hpp"

namespace alloy {

// The rank OpenMPI's launcher reports as ended by a signal or a failure ("mpirun noticed that
// process rank 3 with PID ... exited on signal 9"), or -1 when its output names none.
int elastic_lost_rank(const std::string& launcher_output);

// The cluster file `cluster` was read from (its source_text) with device `device_id` removed: one
// device fewer on its node (a group of several nodes splits off that node). Throws alloy::Error
// when no device would remain.
std::string elastic_cluster_without(const ClusterSpec& cluster, int device_id);

}  // namespace alloy
