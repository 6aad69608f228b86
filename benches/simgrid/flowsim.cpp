// flowsim.cpp: the SimGrid 3.32 side of parasim's solver-speed comparison
// (benches/simgrid/compare.py runs both tools on the same flows, alternating).
//
// Written for parasim (not taken from SimGrid's examples): it builds one of SimGrid's built-in
// cluster zones, every link 100 Gb/s, full duplex (SPLITDUPLEX), and runs either
//   - a flows file: one `src,dst,bytes[,start]` row per flow (hosts are 0-based ids in
//     SimGrid's leaf order; `#` starts a comment line; a header row is skipped), every flow an
//     asynchronous host-to-host communication of its own (its own stream), started at `start`
//     seconds plus, with --pure, its route's latency; or
//   - `ring N BYTES`: the ring all-reduce with per-host step dependencies (2(N-1) steps of
//     BYTES/N each; a host starts step s+1 once its step-s send and receive are both done).
// With `--cfg=network/model:CM02 --cfg=network/crosstraffic:0` and --pure this is plain max-min
// sharing plus each flow's route latency before it enters, which is what parasim's flow network
// computes; the simulated times of the two tools agree to the picosecond.
//
// usage: flowsim [--cfg=..]* TOPO (FLOWS_FILE | ring N BYTES) [--lat SECONDS] [--pure]
//   TOPO  ft:LEVELS;DOWN;UP;COUNT (fat-tree) or df:G,GL;C,CL;R,RL;NODES (Cray Cascade dragonfly)
// prints: RESULT flows=F sim_time_s=T build_wall_s=B run_wall_s=R
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace sg4 = simgrid::s4u;

namespace {
constexpr double kLinkBandwidth = 100e9 / 8; // bytes per second

std::vector<std::string> fields(const std::string& text, char separator)
{
  std::vector<std::string> out;
  std::stringstream stream(text);
  std::string field;
  while (std::getline(stream, field, separator))
    out.push_back(field);
  return out;
}

std::vector<unsigned int> numbers(const std::string& text)
{
  std::vector<unsigned int> out;
  for (const auto& field : fields(text, ','))
    out.push_back(static_cast<unsigned int>(std::stoul(field)));
  return out;
}

std::pair<simgrid::kernel::routing::NetPoint*, simgrid::kernel::routing::NetPoint*>
new_host(sg4::NetZone* zone, const std::vector<unsigned long>& /*coordinates*/, unsigned long id)
{
  const sg4::Host* host = zone->create_host("h" + std::to_string(id), 1e12)->seal();
  return {host->get_netpoint(), nullptr};
}

void build(const std::string& topology, double latency)
{
  const auto parts = fields(topology.substr(3), ';');
  if (parts.size() != 4)
    throw std::invalid_argument("a topology has 4 ';'-separated fields: " + topology);
  const auto policy = sg4::Link::SharingPolicy::SPLITDUPLEX;
  if (topology.rfind("ft:", 0) == 0) {
    sg4::FatTreeParams params(std::stoul(parts[0]), numbers(parts[1]), numbers(parts[2]), numbers(parts[3]));
    sg4::create_fatTree_zone("cluster", nullptr, params, sg4::ClusterCallbacks(new_host), kLinkBandwidth, latency,
                             policy)
        ->seal();
  } else if (topology.rfind("df:", 0) == 0) {
    const auto groups = numbers(parts[0]);
    const auto chassis = numbers(parts[1]);
    const auto routers = numbers(parts[2]);
    sg4::DragonflyParams params({groups[0], groups[1]}, {chassis[0], chassis[1]}, {routers[0], routers[1]},
                                std::stoul(parts[3]));
    sg4::create_dragonfly_zone("cluster", nullptr, params, sg4::ClusterCallbacks(new_host), kLinkBandwidth, latency,
                               policy)
        ->seal();
  } else {
    throw std::invalid_argument("unknown topology " + topology + " (ft:... or df:...)");
  }
}

struct Flow {
  int src;
  int dst;
  double bytes;
  double start;
};

std::vector<Flow> read_flows(const std::string& path)
{
  std::ifstream input(path);
  if (!input)
    throw std::invalid_argument("cannot read " + path);
  std::vector<Flow> flows;
  std::string line;
  while (std::getline(input, line)) {
    if (line.empty() || line[0] == '#' || line.rfind("src", 0) == 0)
      continue;
    const auto row = fields(line, ',');
    if (row.size() < 3)
      throw std::invalid_argument(path + ": a row is src,dst,bytes[,start]: " + line);
    flows.push_back({std::stoi(row[0]), std::stoi(row[1]), std::stod(row[2]), row.size() > 3 ? std::stod(row[3]) : 0});
  }
  return flows;
}

double route_latency(const sg4::Host* src, const sg4::Host* dst, double per_link)
{
  std::vector<sg4::Link*> links;
  src->route_to(dst, links, nullptr);
  return per_link * static_cast<double>(links.size());
}

int dummy = 0;
long completed = 0;
} // namespace

int main(int argc, char** argv)
{
  const auto t0 = std::chrono::steady_clock::now();
  sg4::Engine engine(&argc, argv);
  std::vector<std::string> args(argv + 1, argv + argc);
  double latency = 1e-6;
  bool pure = false;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); i++) {
    if (args[i] == "--pure")
      pure = true;
    else if (args[i] == "--lat" && i + 1 < args.size())
      latency = std::stod(args[++i]);
    else
      positional.push_back(args[i]);
  }
  if (positional.size() != 2 && !(positional.size() == 4 && positional[1] == "ring")) {
    std::fprintf(stderr, "usage: flowsim [--cfg=..] TOPO (FLOWS_FILE | ring N BYTES) [--lat S] [--pure]\n");
    return 2;
  }
  build(positional[0], pure ? 0.0 : latency);
  const double start_latency = pure ? latency : 0.0;
  std::vector<sg4::Host*> hosts(engine.get_host_count());
  for (auto* host : engine.get_all_hosts())
    hosts.at(std::stoul(host->get_name().substr(1))) = host;

  long flows = 0;
  if (positional[1] == "ring") {
    const int n = std::stoi(positional[2]);
    const double chunk = std::floor(std::stod(positional[3]) / n);
    if (n < 2 || n > static_cast<int>(hosts.size()))
      throw std::invalid_argument("ring needs 2..hosts ranks");
    static std::vector<sg4::Mailbox*> boxes;
    for (int i = 0; i < n; i++)
      boxes.push_back(sg4::Mailbox::by_name("ring" + std::to_string(i)));
    for (int i = 0; i < n; i++) {
      const double delay = route_latency(hosts[i], hosts[(i + 1) % n], start_latency);
      sg4::Actor::create("rank" + std::to_string(i), hosts[i], [i, n, chunk, delay]() {
        for (int step = 0; step < 2 * (n - 1); step++) {
          int* got = nullptr;
          sg4::CommPtr receive = boxes[i]->get_async<int>(&got);
          if (delay > 0)
            sg4::this_actor::sleep_for(delay);
          sg4::CommPtr send = boxes[(i + 1) % n]->put_async(&dummy, static_cast<uint64_t>(chunk));
          receive->wait();
          send->wait();
          completed++;
        }
      });
    }
    flows = 2L * (n - 1) * n;
  } else {
    const auto list = read_flows(positional[1]);
    flows = static_cast<long>(list.size());
    for (const auto& flow : list) {
      if (flow.src < 0 || flow.dst < 0 || flow.src >= static_cast<int>(hosts.size()) ||
          flow.dst >= static_cast<int>(hosts.size()))
        throw std::invalid_argument("a flow names a host beyond the platform's " + std::to_string(hosts.size()));
    }
    // One actor starts every flow as its own asynchronous communication at its time and waits
    // for all of them: SimGrid's lightest way to run independent transfers.
    sg4::Actor::create("flows", hosts[0], [list, &hosts, start_latency]() {
      std::vector<std::pair<double, size_t>> order;
      for (size_t k = 0; k < list.size(); k++)
        order.emplace_back(list[k].start + route_latency(hosts[list[k].src], hosts[list[k].dst], start_latency), k);
      std::sort(order.begin(), order.end());
      std::vector<sg4::CommPtr> comms;
      comms.reserve(list.size());
      for (const auto& [at, k] : order) {
        if (at > sg4::Engine::get_clock())
          sg4::this_actor::sleep_until(at);
        comms.push_back(sg4::Comm::sendto_async(hosts[list[k].src], hosts[list[k].dst],
                                                static_cast<uint64_t>(list[k].bytes)));
      }
      sg4::Comm::wait_all(comms);
      completed += static_cast<long>(comms.size());
    });
  }
  const auto t1 = std::chrono::steady_clock::now();
  engine.run();
  const auto t2 = std::chrono::steady_clock::now();
  std::printf("RESULT flows=%ld completed=%ld sim_time_s=%.9f build_wall_s=%.3f run_wall_s=%.3f\n", flows, completed,
              sg4::Engine::get_clock(), std::chrono::duration<double>(t1 - t0).count(),
              std::chrono::duration<double>(t2 - t1).count());
  return 0;
}
