// Reads `<message type> <hex bytes>` lines on stdin and parses each with Mesos's own generated
// classes and libprotobuf, printing one line per input: `ok` (ParseFromString accepts it),
// `missing <fields>` (it decodes but lacks required fields, listed as libprotobuf lists them), or
// `invalid` (not even a partial parse). Used by tests/required_libprotobuf.rs.
#include <mesos/docker/v1.pb.h>
#include <mesos/mesos.pb.h>
#include <mesos/slave/containerizer.pb.h>

#include <iostream>
#include <memory>
#include <string>

namespace {

std::unique_ptr<google::protobuf::Message> make(const std::string& type) {
  if (type == "mesos.ContainerID") return std::make_unique<mesos::ContainerID>();
  if (type == "mesos.Parameters") return std::make_unique<mesos::Parameters>();
  if (type == "mesos.slave.ContainerConfig") {
    return std::make_unique<mesos::slave::ContainerConfig>();
  }
  if (type == "mesos.slave.ContainerRecoverInfo") {
    return std::make_unique<mesos::slave::ContainerRecoverInfo>();
  }
  if (type == "docker.spec.v1.ImageManifest") {
    return std::make_unique<docker::spec::v1::ImageManifest>();
  }
  return nullptr;
}

std::string unhex(const std::string& text) {
  std::string out;
  for (size_t i = 0; i + 1 < text.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(text.substr(i, 2), nullptr, 16)));
  }
  return out;
}

}  // namespace

int main() {
  // Parse failures are answered on stdout; libprotobuf's own log lines would only add noise.
  google::protobuf::SetLogHandler(nullptr);
  std::string type, hex;
  while (std::cin >> type) {
    std::getline(std::cin, hex);
    hex.erase(0, hex.find_first_not_of(' '));
    std::unique_ptr<google::protobuf::Message> message = make(type);
    if (!message) {
      std::cout << "unknown type " << type << std::endl;
      return 1;
    }
    const std::string bytes = unhex(hex);
    if (message->ParseFromString(bytes)) {
      std::cout << "ok" << std::endl;
    } else if (message->ParsePartialFromString(bytes)) {
      std::cout << "missing " << message->InitializationErrorString() << std::endl;
    } else {
      std::cout << "invalid" << std::endl;
    }
  }
  return 0;
}
