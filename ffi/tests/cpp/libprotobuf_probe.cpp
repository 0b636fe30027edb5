// Answers questions about protobuf bytes with Mesos's own generated classes and libprotobuf, one
// line per `<verb> <message type> <hex bytes>` line on stdin. Used by tests/libprotobuf.rs.
//
// - `parse`: `ok` (ParseFromString accepts it), `missing <fields>` (it decodes but lacks required
//   fields, listed as libprotobuf lists them), or `invalid` (not even a partial parse).
// - `merge`: parses the bytes, merges them into a fresh message with MergeFrom, as the agent
//   merges its isolators' answers, and prints the result's bytes in hex (or `invalid`).
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
  if (type == "mesos.ResourceStatistics") return std::make_unique<mesos::ResourceStatistics>();
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

std::string hex(const std::string& bytes) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

}  // namespace

int main() {
  // Parse failures are answered on stdout; libprotobuf's own log lines would only add noise.
  google::protobuf::SetLogHandler(nullptr);
  std::string verb, type, text;
  while (std::cin >> verb >> type) {
    std::getline(std::cin, text);
    text.erase(0, text.find_first_not_of(' '));
    std::unique_ptr<google::protobuf::Message> message = make(type);
    if (!message || (verb != "parse" && verb != "merge")) {
      std::cout << "unknown " << verb << " " << type << std::endl;
      return 1;
    }
    const std::string bytes = unhex(text);
    if (verb == "merge") {
      if (!message->ParseFromString(bytes)) {
        std::cout << "invalid" << std::endl;
        continue;
      }
      std::unique_ptr<google::protobuf::Message> merged(message->New());
      merged->MergeFrom(*message);
      std::cout << hex(merged->SerializeAsString()) << std::endl;
    } else if (message->ParseFromString(bytes)) {
      std::cout << "ok" << std::endl;
    } else if (message->ParsePartialFromString(bytes)) {
      std::cout << "missing " << message->InitializationErrorString() << std::endl;
    } else {
      std::cout << "invalid" << std::endl;
    }
  }
  return 0;
}
